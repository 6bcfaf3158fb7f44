"""RNG states per rank and per device (``accumcore.rng``).

No GPU here: torch.cuda's generator functions are replaced by a stand-in that keeps one state
per device index, as a machine with k GPUs would. Checked: a checkpoint from a process that
saw 4 GPUs resumes on one that sees 2 (no IndexError, devices 0 and 1 restored, the trained
device's generator on the current device); each DDP rank gets its own states back from rank
0's file; and a real two-rank gloo run writes every rank's states into the checkpoint.
"""

from __future__ import annotations

import os
import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from accumcore import rng


class FakeCuda:
    """torch.cuda's RNG surface for ``count`` devices, with ``current`` the one in use."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int, current: int = 0) -> None:
        self.states = {i: torch.tensor([i, 0], dtype=torch.uint8) for i in range(count)}
        self.count, self.current = count, current
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.states[i].clone() for i in range(self.count)])
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self._refuse_all)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self._set)

    def _set(self, state: torch.Tensor, device: int = 0) -> None:
        if device >= self.count:
            raise IndexError(f"device {device} of {self.count}")
        self.states[device] = state.clone()

    def _refuse_all(self, states) -> None:
        if len(states) != self.count:
            raise IndexError("list index out of range")  # what torch does with more states
        for index, state in enumerate(states):
            self._set(state, index)


def _saved_on(monkeypatch: pytest.MonkeyPatch, count: int, current: int) -> dict:
    saving = FakeCuda(monkeypatch, count, current)
    for index in range(count):
        saving.states[index] = torch.tensor([index, 7], dtype=torch.uint8)
    return rng.serialise_rng_state(rng.capture_rng_state())


def test_a_checkpoint_from_more_gpus_resumes_on_fewer(monkeypatch: pytest.MonkeyPatch) -> None:
    state = _saved_on(monkeypatch, count=4, current=3)
    assert state["cuda_device"] == 3 and len(state["cuda"]) == 4
    resuming = FakeCuda(monkeypatch, count=2, current=0)
    rng.restore_rng_state(state)
    # The generator this process trained on (device 3) is on the device it trains on now.
    assert resuming.states[0].tolist() == [3, 7]
    assert resuming.states[1].tolist() == [1, 7]


def test_a_checkpoint_from_fewer_gpus_restores_those_it_has(monkeypatch: pytest.MonkeyPatch) -> None:
    state = _saved_on(monkeypatch, count=1, current=0)
    resuming = FakeCuda(monkeypatch, count=2, current=0)
    rng.restore_rng_state(state)
    assert resuming.states[0].tolist() == [0, 7]
    assert resuming.states[1].tolist() == [1, 0]  # untouched: nothing was saved for it


def test_each_rank_restores_its_own_states(monkeypatch: pytest.MonkeyPatch) -> None:
    per_rank = []
    for rank in range(2):
        # The CPU generator alone: torch.manual_seed would also seed every CUDA device that
        # FakeCuda now claims (two), and on a GPU machine index past the one that exists.
        torch.random.default_generator.manual_seed(100 + rank)
        random.seed(100 + rank)
        cuda = FakeCuda(monkeypatch, count=2, current=rank)
        cuda.states[rank] = torch.tensor([rank, 9], dtype=torch.uint8)
        per_rank.append(rng.serialise_rng_state(rng.capture_rng_state()))
    checkpoint = rng.serialise_rng_state(rng.capture_rng_state(), ranks=per_rank)
    for rank in range(2):
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
        resuming = FakeCuda(monkeypatch, count=2, current=rank)
        torch.random.default_generator.manual_seed(0)
        rng.restore_rng_state(checkpoint)
        assert torch.equal(torch.get_rng_state(), per_rank[rank]["torch"])
        assert resuming.states[rank].tolist() == [rank, 9]
        expected = random.Random(100 + rank).random()
        assert random.random() == expected


def _two_ranks(rank: int, port: int, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch import nn

        from accumcore import Trainer
        from accumcore.data import make_loader

        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5)))
        dataset = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,)))
        torch.manual_seed(10 + rank)  # each rank's own dropout stream
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                          checkpoint_dir=path)
        trainer.fit(make_loader(dataset, 4, seed=1), epochs=1)
        torch.save(torch.get_rng_state(), os.path.join(path, f"rank{rank}.rng"))
    finally:
        dist.destroy_process_group()


def test_ddp_checkpoint_holds_every_ranks_states(tmp_path) -> None:
    from accumcore import load_checkpoint

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_two_ranks, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    state = load_checkpoint(next(tmp_path.glob("*.pt")))
    ranks = state["rng"]["ranks"]
    assert len(ranks) == 2
    for rank in range(2):
        assert torch.equal(ranks[rank]["torch"], torch.load(tmp_path / f"rank{rank}.rng"))
    assert not torch.equal(ranks[0]["torch"], ranks[1]["torch"])


def test_a_keyed_micro_batch_draws_by_its_key_and_puts_the_process_stream_back() -> None:
    """``KeyedRng``: the same key draws the same numbers whatever the process drew before, the
    process's CPU generator is where it was after, and keys of other positions, ranks (a
    per-rank loader's stream) and split pieces differ."""
    keyed = rng.KeyedRng(torch.device("cpu"))
    base = rng.epoch_key(7, 1)
    key = rng.micro_batch_seed(base, 5)
    draws = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        before = torch.get_rng_state()
        saved = keyed.enter(key)
        try:
            draws.append(torch.rand(4))
        finally:
            keyed.exit(saved)
        assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(draws[0], draws[1])
    keys = {rng.micro_batch_seed(rng.epoch_key(s, e), p, r, part)
            for s in (0, 7) for e in (0, 1) for p in range(4) for r in range(3) for part in range(3)}
    assert len(keys) == 2 * 2 * 4 * 3 * 3 and all(0 <= k < 2**63 for k in keys)
    assert keyed.enter(None) is None

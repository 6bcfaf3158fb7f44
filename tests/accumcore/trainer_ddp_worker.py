"""One rank of the DDP tests (run by torch.multiprocessing from test_trainer_ddp.py).

``run``: each rank trains its own shard of padded token sequences, so the ranks' item counts
differ in every window; a comm hook counts gradient all-reduces. ``run_case``: shards of
different sizes (a rank without a micro-batch in a window), an out-of-memory error on one
rank, a stop asked on one rank.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from trainer_reference import TokenCrossEntropy, token_dataset, token_model

from accumcore import Callback, Trainer, load_checkpoint, save_checkpoint
from accumcore.data import make_loader

WORLD = 2
SAMPLES_PER_RANK = 10
MICRO_BATCH = 2
ACCUMULATION = 3  # 5 batches per rank and epoch: windows of 3 and 2 micro-batches
EPOCHS = 2


def shard(rank: int):
    dataset = token_dataset(SAMPLES_PER_RANK * WORLD, seed=11)
    tokens, targets = dataset.tensors
    part = slice(rank * SAMPLES_PER_RANK, (rank + 1) * SAMPLES_PER_RANK)
    return torch.utils.data.TensorDataset(tokens[part], targets[part])


def counting_allreduce(state: dict, bucket):
    state["count"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def run(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        model = DistributedDataParallel(copy.deepcopy(token_model(torch.float64)))
        state = {"count": 0}
        model.register_comm_hook(state, counting_allreduce)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=ACCUMULATION)
        history = trainer.fit(make_loader(shard(rank), MICRO_BATCH, shuffle=False), epochs=EPOCHS)
        # accumcore.load_checkpoint into a DDP-wrapped model (issue 41: the module. prefix).
        saved = Path(out_dir) / f"state{rank}.pt"
        save_checkpoint(trainer.state_dict(), saved)
        fresh = DistributedDataParallel(copy.deepcopy(token_model(torch.float64)))
        fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.5)
        loaded = load_checkpoint(saved, model=fresh, optimizer=fresh_optimizer)
        Trainer(fresh, fresh_optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=ACCUMULATION).load_state_dict(loaded)
        assert all(torch.equal(p, q) for p, q in zip(fresh.parameters(), model.parameters(), strict=True))
        assert str(fresh_optimizer.state_dict()) == str(optimizer.state_dict())
        torch.save(
            {"params": [p.detach() for p in model.module.parameters()], "allreduces": state["count"],
             "losses": [s["loss"] for s in history.steps], "items_per_step": [s["items_per_s"] * s["step_time_s"] for s in history.steps]},
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------- uneven shards, OOM, stop
UNEVEN = (7, 4)  # samples per rank: 4 and 2 micro-batches of 2; N=2: rank 1 has no 2nd window
UNEVEN_EPOCHS = 2


def uneven_shard(rank: int):
    dataset = token_dataset(sum(UNEVEN), seed=12)
    tokens, targets = dataset.tensors
    start = sum(UNEVEN[:rank])
    part = slice(start, start + UNEVEN[rank])
    return torch.utils.data.TensorDataset(tokens[part], targets[part])


class InjectedOOM(torch.nn.Module):
    """Raises CUDA's out-of-memory error for batches of more than ``limit`` samples."""

    def __init__(self, inner: torch.nn.Module, limit: int) -> None:
        super().__init__()
        self.inner = inner
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected on this rank)")
        return self.inner(x)


class Record(Callback):
    def __init__(self, stop_after_polls: int | None = None) -> None:
        self.events: list[str] = []
        self.stop_after = stop_after_polls
        self.polls = 0

    def on_event(self, trainer, kind, message, data) -> None:
        self.events.append(kind)

    def should_stop(self) -> bool:
        self.polls += 1
        return self.stop_after is not None and self.polls > self.stop_after


def run_case(rank: int, case: str, init_file: str, out_dir: str) -> None:
    """``case``: "uneven" (rank 1 runs out of data first), "oom" (rank 1 alone runs out of
    memory at 2 samples), "stop" (rank 0 alone asks to stop after its first window)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        limit = 1 if case == "oom" and rank == 1 else 100
        model = DistributedDataParallel(InjectedOOM(copy.deepcopy(token_model(torch.float64)), limit))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        record = Record(stop_after_polls=1 if case == "stop" and rank == 0 else None)
        trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=2, callbacks=[record])
        history = trainer.fit(make_loader(uneven_shard(rank), MICRO_BATCH, shuffle=False), epochs=UNEVEN_EPOCHS)
        torch.save(
            {"params": [p.detach() for p in model.module.inner.parameters()], "events": record.events,
             "steps": trainer.global_step, "stopped": history.stopped, "split": trainer.oom_split,
             "losses": [s["loss"] for s in history.steps]},
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()

"""``Trainer(verify_window=...)``: the first window's accumulated gradient against its big batch.

Models like the catalog's (dropout, BatchNorm, padded tokens) pass in every precision (the check
runs in fp32, eval mode); the three classic mistakes (a loss that sums, a wrong item count,
labels the model shifts itself) fail it with the cause named; "warn" trains on; the check
changes nothing training computes (bitwise, CPU); a custom collate, a memory cap (sub-window)
and two gloo ranks with different item counts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from rank_processes import start_method
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from trainer_reference import VOCAB, TokenCrossEntropy, token_dataset, token_model

from accumcore import Callback, ExactnessError, NonFiniteError, Trainer
from accumcore.data import make_loader
from accumcore.peak_memory import cpu_peak_added
from accumcore.verify_window import TOLERANCE, check_window
from accumcore.window import make_micro_batches


class Events(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict]] = []

    def on_event(self, trainer, kind, message, data) -> None:
        self.events.append((kind, message, data))

    def exactness(self) -> list[tuple[str, dict]]:
        return [(message, data) for kind, message, data in self.events if kind == "exactness_check"]


def _fp16_on_cpu() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            out = nn.Linear(2, 2)(torch.ones(1, 2))
        torch.amp.GradScaler("cpu")
    except (RuntimeError, AttributeError, TypeError):
        return False
    return out.dtype == torch.float16


# --------------------------------------------------------------- catalog-like models
class SmallCNN(nn.Module):
    """Like the catalog's small_cnn: convolutions, BatchNorm, dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(4 * 4 * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(16, 10))


def digits_like(n: int = 46, seed: int = 3) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


CASES = {
    "small_cnn": (SmallCNN, digits_like, nn.CrossEntropyLoss),
    "mlp": (mlp, digits_like, nn.CrossEntropyLoss),
    "tokens": (lambda: token_model(torch.float32), lambda: token_dataset(46, seed=4), TokenCrossEntropy),
}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_catalog_like_models_pass_in_every_precision(case: str, precision: str) -> None:
    if precision == "fp16" and not _fp16_on_cpu():
        pytest.fail("this torch build has no fp16 autocast on the CPU; the fp16 case needs it")
    build, data, loss = CASES[case]
    torch.manual_seed(0)
    model = build()
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), loss_fn=loss(),
                      accumulation_steps=4, precision=precision, callbacks=[events], verify_window=True)
    loader = make_loader(data(), 5, seed=1)
    history = trainer.fit(loader, epochs=1, max_steps=2)
    [(message, result)] = events.exactness()
    assert result["passed"] is True and result["rel_error"] <= TOLERANCE, message
    assert result["tolerance"] == TOLERANCE and result["precision"] == "fp32"
    assert result["micro_batches"] == result["window_micro_batches"] == 4
    # W and n_i are the first window's, as training counts them.
    loader.batch_sampler.set_epoch(0)
    first = list(loader)[:4]
    counts = [float((y != -100).sum()) for _, y in first]
    assert result["item_counts"] == counts and result["items"] == sum(counts)
    assert "first window = big batch" in message
    assert len(history.steps) == 2


# ------------------------------------------------------------------ the three mistakes
class SumLoss(nn.Module):
    """Claims a mean (so the trainer's construction check passes it) but returns the sum."""

    reduction = "mean"

    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target, reduction="sum")


class ShiftingLM(nn.Module):
    """A causal LM that shifts its labels itself and returns its own loss (HF style)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = token_model(torch.float32)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.inner(input_ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def lm_batches(seed: int = 5) -> list[dict[str, torch.Tensor]]:
    tokens, targets = token_dataset(24, length=6, seed=seed).tensors
    return [{"input_ids": tokens[i : i + 4], "labels": targets[i : i + 4]} for i in range(0, 24, 4)]


def _mistake(name: str, mode: bool | str, events: Events):
    torch.manual_seed(0)
    if name == "sum":
        model: nn.Module = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        g = torch.Generator().manual_seed(6)
        data = TensorDataset(torch.randn(30, 4, generator=g), torch.randint(0, 3, (30,), generator=g))
        kwargs = {"loss_fn": SumLoss()}
        loader = make_loader(data, 5, seed=0)
    elif name == "count_items":
        model = token_model(torch.float32)
        kwargs = {"loss_fn": TokenCrossEntropy(), "count_items": "rows"}
        loader = make_loader(token_dataset(30, seed=7), 5, seed=0)
    else:
        model = ShiftingLM()
        kwargs = {"shift_labels": False}  # wrong: the model scores labels[..., 1:]
        loader = lm_batches()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=3,
                      callbacks=[events], verify_window=mode, **kwargs)
    return trainer, loader


MISTAKES = {
    "sum": ("reduction", "reduction='mean'"),
    "count_items": ("count_items", "count_items='tokens'"),
    "shift_labels": ("shift_labels", "shift_labels=True"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_mistake_fails_before_the_first_step_naming_the_cause(mistake: str) -> None:
    events = Events()
    trainer, loader = _mistake(mistake, True, events)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    cause, fix = MISTAKES[mistake]
    with pytest.raises(ExactnessError, match="first window != big batch") as raised:
        trainer.fit(loader, epochs=1)
    assert raised.value.cause == cause and fix in str(raised.value)
    assert raised.value.rel_error > TOLERANCE and raised.value.tolerance == TOLERANCE
    assert "verify_window='warn'" in str(raised.value)
    # Failed before the first optimizer step: the weights are the initial ones.
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), before, strict=True))
    [(message, data)] = events.exactness()
    assert data["passed"] is False and data["cause"] == cause and fix in message


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_warn_records_the_failure_and_trains_on(mistake: str) -> None:
    events = Events()
    trainer, loader = _mistake(mistake, "warn", events)
    history = trainer.fit(loader, epochs=1)
    assert len(history.steps) == 2 and trainer.global_step == 2
    [(message, data)] = events.exactness()
    assert data["passed"] is False and data["rel_error"] > TOLERANCE
    assert data["cause"] == MISTAKES[mistake][0]
    assert any(e["kind"] == "exactness_check" for e in history.events)


# ------------------------------------------------------------------- changes nothing
class RandomFlip(torch.utils.data.Dataset):
    """A dataset with a random transform drawn from the global RNG as samples load; with
    ``targets`` the trainer counts windows from them and loads inputs just in time."""

    def __init__(self, base: TensorDataset, targets: bool) -> None:
        self.base = base
        if targets:
            self.targets = base.tensors[1]

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        x, y = self.base[index]
        return (x.flip(-1) if torch.rand(()) < 0.5 else x), y


def _train(verify: bool | str, loader_kind: str) -> tuple[list[torch.Tensor], list[float], list]:
    torch.manual_seed(11)
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    events = Events()
    trainer = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=3,
                      callbacks=[events], verify_window=verify)
    data = digits_like(40)
    if loader_kind == "make_loader":
        loader = make_loader(data, 4, seed=2)
    else:  # draws its order and the transforms from the global RNG
        loader = DataLoader(RandomFlip(data, loader_kind == "transform_targets"), batch_size=4, shuffle=True)
    history = trainer.fit(loader, epochs=2)
    params = [p.detach().clone() for p in model.parameters()] + [b.clone() for b in model.buffers()]
    return params, [s["loss"] for s in history.steps], events.exactness()


@pytest.mark.parametrize("loader_kind", ["make_loader", "transform_targets", "transform_read_ahead"])
def test_training_with_the_check_equals_training_without_bitwise(loader_kind: str) -> None:
    off, losses_off, none = _train(False, loader_kind)
    on, losses_on, checked = _train(True, loader_kind)
    assert not none and checked and checked[0][1]["passed"] is True
    assert losses_on == losses_off
    assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True))


def test_check_restores_modes_grads_buffers_and_rng() -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    model.train()
    model.features[1].eval()  # a BatchNorm the user froze on purpose stays frozen
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    grads = [p.grad for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]
    x, y = digits_like(12).tensors
    micro = make_micro_batches([(x[:4], y[:4]), (x[4:9], y[4:9]), (x[9:], y[9:])], 1, lambda _i, t: len(t))
    state = torch.get_rng_state()
    result = check_window(model, nn.CrossEntropyLoss(), micro, torch.device("cpu"))
    assert result.rel_error is not None and result.rel_error <= TOLERANCE
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training and not model.features[1].training and model.head[1].training
    assert all(p.grad is g for p, g in zip(model.parameters(), grads, strict=True))
    assert all(torch.equal(b, c) for b, c in zip(model.buffers(), buffers, strict=True))


def test_no_check_on_a_resume_past_step_zero() -> None:
    torch.manual_seed(0)
    data = digits_like(40)
    model = mlp()
    first = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=2)
    first.fit(make_loader(data, 4), epochs=1, max_steps=2)
    events = Events()
    model = mlp()
    resumed = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=2,
                      callbacks=[events], verify_window=True)
    resumed.load_state_dict(first.state_dict())
    resumed.fit(make_loader(data, 4), epochs=1)
    assert resumed.global_step > 2 and not events.exactness()


def test_a_nonfinite_first_window_is_left_to_on_nonfinite() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    g = torch.Generator().manual_seed(6)
    data = TensorDataset(torch.randn(12, 4, generator=g) * torch.tensor([1.0, float("inf"), 1.0, 1.0]),
                         torch.randint(0, 3, (12,), generator=g))
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2, callbacks=[events], verify_window=True)
    with pytest.raises(NonFiniteError):
        trainer.fit(make_loader(data, 3, shuffle=False), epochs=1)
    [(message, result)] = events.exactness()
    assert result["passed"] is None and "not finite" in message


def test_verify_window_refuses_other_values() -> None:
    model = mlp()
    with pytest.raises(ValueError, match="verify_window must be False, True, 'warn' or 'strict'"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), verify_window="yes")
    with pytest.raises(ValueError, match="verify_memory_limit_bytes must be >= 1"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), verify_memory_limit_bytes=0)


# ------------------------------------------------------------ custom collate, memory cap
@dataclass
class Sequences(torch.utils.data.Dataset):
    """Token sequences of different lengths: batches are padded to their own longest one."""

    tokens: list[torch.Tensor]
    targets: list[torch.Tensor]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int):
        return self.tokens[index], self.targets[index]


def pad_collate(samples):
    length = max(len(t) for t, _ in samples)
    tokens = torch.zeros(len(samples), length, dtype=torch.long)
    targets = torch.full((len(samples), length), -100)
    for row, (t, y) in enumerate(samples):
        tokens[row, : len(t)], targets[row, : len(y)] = t, y
    return tokens, targets


def sequences(n: int = 24, seed: int = 8) -> Sequences:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g).tolist()
    return Sequences([torch.randint(0, VOCAB, (k,), generator=g) for k in lengths],
                     [torch.randint(0, VOCAB, (k,), generator=g) for k in lengths])


@pytest.mark.parametrize("hook", [True, False])
def test_custom_collate_is_checked_through_the_loaders_collate_fn(hook: bool) -> None:
    data = sequences()
    loader = make_loader(data, 3, shuffle=False, collate_fn=pad_collate)  # issue 41: accumcore's own loader
    if hook:  # the loader says how to get targets by index: the check gets the samples' indices
        loader.targets_for = lambda indices: pad_collate([data[i] for i in indices])[1]  # type: ignore[attr-defined]
    torch.manual_seed(0)
    model = token_model(torch.float32)
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=TokenCrossEntropy(),
                      accumulation_steps=4, callbacks=[events], verify_window=True)
    history = trainer.fit(loader, epochs=1)
    [(message, result)] = events.exactness()
    if hook:
        assert result["passed"] is True and result["rel_error"] <= TOLERANCE, message
        assert result["items"] == sum(len(data[i][1]) for i in range(12))
    else:  # skipped, saying why and how to make it possible; training goes on
        assert result["passed"] is None and result["rel_error"] is None
        assert "cannot be concatenated" in message and "targets_for" in message
        assert "make_loader(collate_fn=...)" in message and "tuple" in message
    assert len(history.steps) == 2


def _big_batch_peak(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    def run() -> None:
        F.cross_entropy(model(x), y).backward()

    peak = cpu_peak_added(run)
    model.zero_grad(set_to_none=True)
    return peak


def test_a_memory_cap_checks_the_micro_batches_that_fit() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))
    g = torch.Generator().manual_seed(9)
    data = TensorDataset(torch.randn(64, 32, generator=g), torch.randint(0, 4, (64,), generator=g))
    x, y = data.tensors
    # A cap between the big batch of 2 micro-batches (16 samples) and of 4 (32): of the
    # window's 8, the check can use 2.
    two, four = _big_batch_peak(model, x[:16], y[:16]), _big_batch_peak(model, x[:32], y[:32])
    assert two < four
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=8,
                      callbacks=[events], verify_window=True, verify_memory_limit_bytes=(two + four) // 2)
    trainer.fit(make_loader(data, 8, shuffle=False), epochs=1)
    [(message, result)] = events.exactness()
    assert result["micro_batches"] == 2 and result["window_micro_batches"] == 8
    assert result["passed"] is True and "sub-window: the first 2 of 8 micro-batches" in message
    assert result["items"] == 16
    # A cap nothing fits under: skipped with the reason, never silently.
    events = Events()
    other = copy.deepcopy(model)
    trainer = Trainer(other, torch.optim.SGD(other.parameters(), lr=0.1), accumulation_steps=8,
                      callbacks=[events], verify_window=True, verify_memory_limit_bytes=1024)
    trainer.fit(make_loader(data, 8, shuffle=False), epochs=1)
    [(message, result)] = events.exactness()
    assert result["passed"] is None and "does not fit in fp32 within 1024 bytes" in message


# ---------------------------------------------------------------------- DDP, 2 ranks
WORLD = 2


class SumTokens(nn.Module):
    """Says it is a mean, returns the sum over tokens."""

    reduction = "mean"
    ignore_index = -100

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return TokenCrossEntropy("sum")(logits, targets)


def _ddp_rank(rank: int, init_file: str, out_dir: str, sums: bool) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        model = DistributedDataParallel(token_model(torch.float32))
        events = Events()
        loss: nn.Module = SumTokens() if sums else TokenCrossEntropy()
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=loss,
                          accumulation_steps=3, callbacks=[events], verify_window=True)
        # Different padding on each rank: the ranks' item counts differ.
        shard = token_dataset(12, seed=20 + rank)
        error = None
        try:
            trainer.fit(make_loader(shard, 2, shuffle=False), epochs=1)
        except ExactnessError as exc:
            error = {"cause": exc.cause, "message": str(exc)}
        first = [(y != -100).sum().item() for _, y in list(make_loader(shard, 2, shuffle=False))[:3]]
        torch.save({"events": events.exactness(), "error": error, "first_window_items": first,
                    "steps": trainer.global_step}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sums", [False, True])
def test_two_gloo_ranks_check_their_shares_and_rank0_reports_the_worst(tmp_path, sums: bool) -> None:
    import torch._dynamo  # noqa: F401  # imported before forking, as test_trainer_ddp does

    mp.start_processes(_ddp_rank, args=(str(tmp_path / "init"), str(tmp_path), sums), nprocs=WORLD,
                       join=True, start_method=start_method())
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    items = [sum(r["first_window_items"]) for r in results]
    assert items[0] != items[1]
    assert results[1]["events"] == []  # rank 0 reports
    [(message, data)] = results[0]["events"]
    assert data["items"] == sum(items) and data["ranks_checked"] == WORLD
    if not sums:
        assert data["passed"] is True and data["rel_error"] <= TOLERANCE, message
        assert all(r["error"] is None and r["steps"] == 2 for r in results)
    else:  # every rank fails together (none waits forever for the other)
        assert data["passed"] is False
        assert all(r["error"] is not None and r["steps"] == 0 for r in results)
        assert results[0]["error"]["cause"] == "reduction"


def _ddp_pending_rank(rank: int, init_file: str, out_dir: str) -> None:
    """First window of full rows on both ranks (a row mean is the token mean there), padded rows
    after: the check is pending, then both ranks look at window 2 together and fail there."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bench.trainer.exactness_detection import RowMean

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        model = DistributedDataParallel(token_model(torch.float32))
        events = Events()
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=RowMean(),
                          accumulation_steps=3, callbacks=[events], verify_window=True)
        g = torch.Generator().manual_seed(30 + rank)
        full = [(torch.randint(0, VOCAB, (2, 6), generator=g), torch.randint(0, VOCAB, (2, 6), generator=g))
                for _ in range(3)]
        x, y = token_dataset(12, seed=20 + rank).tensors
        batches = full + [(x[i:i + 2], y[i:i + 2]) for i in range(0, 12, 2)]
        error = None
        try:
            trainer.fit(batches, epochs=1)
        except ExactnessError as exc:
            error = {"cause": exc.cause, "message": str(exc)}
        torch.save({"events": events.exactness(), "error": error, "steps": trainer.global_step},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_stay_pending_together_and_fail_together_later(tmp_path) -> None:
    import torch._dynamo  # noqa: F401  # imported before forking, as test_trainer_ddp does

    mp.start_processes(_ddp_pending_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD,
                       join=True, start_method=start_method())
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert results[1]["events"] == []  # rank 0 reports
    (_, pending), (message, failed) = results[0]["events"]
    assert pending["status"] == "pending" and pending["passed"] is None
    assert failed["status"] == "failed" and failed["step"] == 1 and "count_items='rows'" in message
    assert all(r["error"] is not None and r["error"]["cause"] == "count_items" and r["steps"] == 1 for r in results)

"""One gloo rank of test_rank_agreement.py: cases that only show when the ranks differ, run one
after the other in the same processes (a spawn costs seconds), each with a Trainer of its own.

- The exactness check across ranks (issue 41 item 3): a loss exact on rank 0's rows and not on
  rank 1's; fewer micro-batches than ranks (each rank's share one row); a rank that cannot
  check its share under ``verify_window="strict"``.
- Errors agreed across ranks (issue 41 item 4): only rank 1 sees the bad input (targets that
  cannot be counted, before the window's collectives, with and without the check; a loss that
  sums, refused by the loss check on rank 1 alone; a token id out of range in the forward of a
  micro-batch inside the window): both ranks raise ``RankFailed`` with the same message, at
  once, instead of rank 0 waiting in a collective until the process group's timeout.
- Label-shift detection agreed by the ranks: a tiny float64 causal LM shaped like Hugging
  Face's (keyword batches, its own shifted loss, attention heads reshaped as GPT-2 does, which
  an empty batch cannot be) sharded with FSDP2, ``loss_fn=None`` and no ``shift_labels``, rank 1
  without a micro-batch in the first window (it deadlocked: only rank 0 ran the detection's
  forward, a collective; and the zero-weight passes on 0 rows failed the reshape); a BatchNorm1d
  model whose micro-batch of one sample on rank 1 is refused in its forward.
- The check on a sharded model (FSDP2 ``fully_shard``, float64): uneven shares (3 and 2
  micro-batches) pass and train as without the check; a loss that sums and a per-row mean that
  only rank 1's padded rows expose fail at window 1 on both ranks with the fix named.
"""

from __future__ import annotations

import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from trainer_reference import VOCAB, TokenCrossEntropy, token_dataset, token_model

import accumcore
from accumcore import Callback, ExactnessError, Trainer
from accumcore.distributed import RankFailed


class Events(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict]] = []

    def on_event(self, trainer, kind, message, data) -> None:
        self.events.append((kind, message, data))


class RowMean(nn.Module):
    """Declares a mean, averages per-row means (not the token mean the trainer counts)."""

    reduction = "mean"

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        per_token = nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="none")
        valid = (targets != -100).to(per_token.dtype)
        return ((per_token * valid).sum(1) / valid.sum(1).clamp(min=1)).mean()


class SumTokens(nn.Module):
    """Declares a mean, returns the sum over tokens."""

    reduction = "mean"

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return TokenCrossEntropy("sum")(logits, targets)


def _full_rows(rank: int, n: int, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(40 + rank)
    return torch.randint(0, VOCAB, (n, length), generator=g), torch.randint(0, VOCAB, (n, length), generator=g)


def _fit(batches: list, loss: Any, steps: int, verify: bool | str, sharded: bool = False,
         mixed: bool = False) -> dict[str, Any]:
    """Fit a DDP (or FSDP2-sharded, float64; float32 computing in bf16 with ``mixed``) token
    model on this rank's ``batches``; the exactness events, the error, the final parameters."""
    if mixed:
        model: nn.Module = accumcore.shard(token_model(torch.float32), mixed_precision=True)
    elif sharded:
        model = accumcore.shard(token_model(torch.float64))
    else:
        model = DistributedDataParallel(token_model(torch.float32))
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=loss,
                      accumulation_steps=steps, callbacks=[events], verify_window=verify)
    error = None
    started = time.monotonic()
    try:
        trainer.fit(batches, epochs=1)
    except ExactnessError as exc:
        error = {"cause": exc.cause, "message": str(exc)}
    except RankFailed as exc:
        error = {"rank": exc.rank, "kind": exc.kind, "message": str(exc), "own": type(exc.__cause__).__name__}
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for p in model.parameters()]
    return {"events": [(m, d) for k, m, d in events.events if k == "exactness_check"], "error": error,
            "steps": trainer.global_step, "seconds": time.monotonic() - started, "params": params}


def exact_on_rank0_only(rank: int) -> dict[str, Any]:
    """Rows of full length on rank 0 (a row mean is the token mean there), padded rows on
    rank 1: only rank 1's share shows the per-row mean."""
    if rank == 0:
        x, y = _full_rows(rank, 4)
    else:
        x, y = token_dataset(4, seed=21).tensors
    return _fit([(x[:2], y[:2]), (x[2:], y[2:])], RowMean(), 2, True)


def fewer_micro_batches_than_ranks(rank: int) -> dict[str, Any]:
    """One micro-batch of one padded row per rank and window: no rank's share can tell a sum
    from a mean; the window over both ranks can."""
    x, y = token_dataset(4, seed=22 + rank).tensors
    return _fit([(x[i:i + 1], y[i:i + 1]) for i in range(4)], SumTokens(), 1, True)


def one_rank_cannot_check(rank: int, mode: bool | str) -> dict[str, Any]:
    """Rank 1's micro-batches are tuples of different lengths (nothing to concatenate, no
    indices): rank 0 checks its share, rank 1 cannot."""
    if rank == 0:
        x, y = token_dataset(4, seed=23).tensors
        batches = [(x[:2], y[:2]), (x[2:], y[2:])]
    else:
        x, y = token_dataset(2, seed=24).tensors
        x4, y4 = token_dataset(2, length=4, seed=25).tensors
        batches = [(x, y), (x4, y4)]
    return _fit(batches, TokenCrossEntropy(), 2, mode)


def _good_batches(rank: int) -> list:
    x, y = token_dataset(8, seed=26 + rank).tensors
    return [(x[i:i + 2], y[i:i + 2]) for i in range(0, 8, 2)]


def bad_targets_on_rank1(rank: int, verify: bool, sharded: bool = False) -> dict[str, Any]:
    """Rank 1's third micro-batch (window 2; window 1 with the check on) has targets the
    trainer cannot count (a list): refused before the window's all-reduce (and, sharded,
    before the window's FSDP passes)."""
    batches = _good_batches(rank)
    if rank == 1:
        bad = 0 if verify else 2
        batches[bad] = (batches[bad][0], batches[bad][1].tolist())
    return _fit(batches, TokenCrossEntropy(), 2, verify, sharded=sharded)


def summing_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """No ``reduction`` attribute, so the trainer checks it; it sums."""
    return TokenCrossEntropy("sum")(logits, targets)


def loss_check_on_rank1(rank: int) -> dict[str, Any]:
    """Rank 0's micro-batches hold one row (the loss check needs two: it never runs there);
    rank 1's hold two: the check refuses the sum on rank 1 only."""
    batches = _good_batches(rank)
    if rank == 0:
        batches = [(x[:1], y[:1]) for x, y in batches]
    return _fit(batches, summing_loss, 2, False)


def forward_error_on_rank1(rank: int) -> dict[str, Any]:
    """Rank 1's fourth micro-batch (the last of window 2) holds a token id past the
    vocabulary: its forward raises inside the window, after the window's all-reduce."""
    batches = _good_batches(rank)
    if rank == 1:
        x, y = batches[3]
        batches[3] = (torch.full_like(x, VOCAB + 5), y)
    return _fit(batches, TokenCrossEntropy(), 2, False)


def _sharded_batches(rank: int) -> list:
    """Padded rows: 3 micro-batches on rank 0, 2 on rank 1 (it runs a zero-weight pass)."""
    x, y = token_dataset(10, seed=30 + rank).tensors
    return [(x[i:i + 2], y[i:i + 2]) for i in range(0, 6 if rank == 0 else 4, 2)]


def sharded_exact(rank: int) -> dict[str, Any]:
    checked = _fit(_sharded_batches(rank), TokenCrossEntropy(), 3, True, sharded=True)
    checked["unchecked_params"] = _fit(_sharded_batches(rank), TokenCrossEntropy(), 3, False, sharded=True)["params"]
    return checked


def sharded_rows(rank: int) -> dict[str, Any]:
    if rank == 0:
        x, y = _full_rows(rank, 4)
        batches = [(x[:2], y[:2]), (x[2:], y[2:])]
    else:
        batches = _sharded_batches(rank)
    return _fit(batches, RowMean(), 2, True, sharded=True)


class TinyCausalLM(nn.Module):
    """``model(input_ids=, labels=)`` -> {"loss", "logits"}: the mean cross-entropy of
    logits[:, :-1] against labels[:, 1:], as a Hugging Face causal LM scores them; its hidden
    states are split into heads with ``view(B, T, -1, 2)``, as GPT-2's attention does (0 rows
    cannot be reshaped so)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        h = self.mix(self.embed(input_ids))
        h = torch.tanh(h.view(h.shape[0], h.shape[1], -1, 2)).reshape(h.shape)
        logits = self.head(h)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                                                      ignore_index=-100)
        return out


def sharded_lm_detection(rank: int) -> dict[str, Any]:
    """Rank 0 has 3 keyword micro-batches, rank 1 none: windows of 2 per rank."""
    torch.manual_seed(0)
    model = accumcore.shard(TinyCausalLM().to(torch.float64))
    x, y = token_dataset(8, seed=40 + rank).tensors
    # Rank 1 has no micro-batch in the first window: it comes to the detection without data.
    batches = [{"input_ids": x[i:i + 2], "labels": y[i:i + 2]} for i in range(0, 6, 2)] if rank == 0 else []
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=None, accumulation_steps=2,
                      callbacks=[events])
    started = time.monotonic()
    trainer.fit(batches, epochs=1)
    return {"shift": trainer.shift_labels, "steps": trainer.global_step, "seconds": time.monotonic() - started,
            "detected": [d for k, _, d in events.events if k == "shift_labels_detected"]}


def batchnorm_refuses_one_sample(rank: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)))
    g = torch.Generator().manual_seed(50 + rank)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    batches = [(x[i:i + 2], y[i:i + 2]) for i in range(0, 8, 2)]
    if rank == 1:
        batches[1] = (x[2:3], y[2:3])  # one sample: "Expected more than 1 value per channel"
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2)
    started = time.monotonic()
    error = None
    try:
        trainer.fit(batches, epochs=1)
    except RankFailed as exc:
        error = {"rank": exc.rank, "kind": exc.kind, "message": str(exc), "own": type(exc.__cause__).__name__}
    return {"error": error, "steps": trainer.global_step, "seconds": time.monotonic() - started}


CASES = {
    "exact_on_rank0_only": exact_on_rank0_only,
    "fewer_micro_batches_than_ranks": fewer_micro_batches_than_ranks,
    "cannot_check_strict": lambda rank: one_rank_cannot_check(rank, "strict"),
    "cannot_check_true": lambda rank: one_rank_cannot_check(rank, True),
    "bad_targets": lambda rank: bad_targets_on_rank1(rank, False),
    "bad_targets_checked": lambda rank: bad_targets_on_rank1(rank, True),
    "sharded_bad_targets": lambda rank: bad_targets_on_rank1(rank, False, sharded=True),
    "loss_check": loss_check_on_rank1,
    "forward_error": forward_error_on_rank1,
    "sharded_exact": sharded_exact,
    "sharded_sums": lambda rank: _fit(_sharded_batches(rank), SumTokens(), 3, True, sharded=True),
    "sharded_rows": sharded_rows,
    "sharded_mixed": lambda rank: _fit(_sharded_batches(rank), TokenCrossEntropy(), 3, True, mixed=True),
    "sharded_lm_detection": sharded_lm_detection,
    "batchnorm_one_sample": batchnorm_refuses_one_sample,
}


def run(rank: int, world: int, init_file: str, out_dir: str, names: list[str]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        results = {name: CASES[name](rank) for name in names}
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()

"""The exactness check on a sharded (FSDP2) model: the window's gradient, reduce-scattered,
against the big batch's, shard by shard.

The check of ``verify_window`` needs the big batch's gradient through the same model. Under
FSDP no rank holds the whole model, and every forward all-gathers and every backward
reduce-scatters: every rank runs the same passes. So each rank runs one big-batch pass of its
own share of the window (its micro-batches concatenated; a rank with none a zero-weight pass
on one row times 0), weighted W_rank x k / W (FSDP divides by the world size k), and FSDP's
reduce-scatter leaves each rank the shard of sum_r W_r / W grad(mean loss of share r): the
gradient of the window's mean, where the loss is the mean over the counted items. Then the
trainer's own window code runs the micro-batches (n_i x k / W, zero-weight passes where a rank
has fewer). The two sharded gradients are compared on each rank's shards and the squared sums
all-reduced: the relative error of the whole flattened gradient, as in one process (each
share's error does not depend on its weight, as under DDP). Above the tolerance, the other
weightings (a sum, per-row or per-token counts, the other label shift) are re-run the same
collective way, and the one that matches names the fix on every rank.

As ``verify_window``: eval mode, fp32 (autocast off), modes, buffers, gradients and every RNG
put back, the optimizer not touched. Not done here: the memory cap's sub-window (the big
batch of a rank's share must fit), and gathering micro-batches over ranks for a window that
no rank's share can tell about (it stays ``pending``, looked at again later).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from accumcore import distributed, items, sharding
from accumcore.precision import Precision
from accumcore.rng import restore_rng_state
from accumcore.verify_weights import (
    alternatives,
    concat,
    counts_of,
    inconclusive_reason,
    named_params,
    proportional,
    put_back,
    unequal_parts,
)
from accumcore.window import MicroBatch, WindowRunner, _zero_through

Params = list[tuple[str, torch.nn.Parameter]]


def check_sharded(trainer: Any, micro_batches: list[MicroBatch], tolerance: float) -> dict[str, Any]:
    """Every rank calls it with its share of the window; the same event data on every rank."""
    model = trainer.model
    params = named_params(model, trainer.loss_fn)
    device = distributed.comm_device(model)
    shift = bool(trainer.shift_labels)
    data: dict[str, Any] = {"tolerance": tolerance, "precision": "fp32", "mode": "eval", "sharded": True,
                            "cause": None, "fix": None, "pending": None, "worst_tensor": None,
                            "max_tensor_rel_error": None, "window_micro_batches": len(micro_batches)}
    low = sharding.low_precision_compute(model)
    if low is not None:  # the same policy on every rank: every rank returns here
        data.update(rel_error=None, items=0.0, micro_batches=0, note=(
            f"skipped: the sharded model computes in {str(low).replace('torch.', '')} (its "
            "MixedPrecisionPolicy), so the check's fp32 comparison cannot run on it; check it "
            "sharded without mixed_precision"))
        return data
    with put_back(model, params) as rng:
        restore_rng_state(rng)
        loaded = [MicroBatch(*mb.load(), mb.items, mb.samples) for mb in micro_batches]
        if len(loaded) == 1:
            counter = trainer.count_items
            loaded = unequal_parts(loaded[0], counter, trainer.loss_fn, trainer.ignore_index, shift)
        big = None
        note = ""
        if loaded:
            try:
                big = (concat([mb.inputs for mb in loaded]), concat([mb.targets for mb in loaded]))
            except (RuntimeError, TypeError, ValueError) as exc:
                note = f"rank {distributed.rank()}: skipped: the micro-batches cannot be concatenated ({exc})"
        local_items = float(sum(float(mb.items) for mb in loaded))
        told = bool(loaded) and inconclusive_reason(loaded, trainer.loss_fn, trainer.ignore_index, shift) is None
        notes = distributed.gather_objects(note) or [note]
        total, told_ranks, parts = distributed.all_reduce_sum(
            [local_items, float(told), float(len(loaded))], device).tolist()
        data.update(items=total, micro_batches=int(parts), ranks_checked=distributed.world_size(),
                    window_micro_batches=int(distributed.all_reduce_sum([len(micro_batches)], device)[0]))
        if any(notes):
            data.update(rel_error=None, note="; ".join(n for n in notes if n))
            return data
        if total == 0:
            data.update(rel_error=None, note="the window has no items (every target ignore_index): nothing to compare")
            return data
        with torch.autocast(device.type, enabled=False):
            empty = sharding.shared_empty_rows(items.one_row(loaded[0].inputs) if loaded else None)
            world = distributed.world_size()
            _weighted_pass(trainer, big, local_items * world / total, empty)
            reference = _local_grads(params)
            runner = WindowRunner(model, trainer.loss_fn, Precision("fp32", trainer.device), trainer.device, None)
            runner.empty_inputs = empty
            runner.run(loaded)
            accumulated = _local_grads(params)
            rel, worst, worst_name = _sharded_errors(params, accumulated, reference, device)
            data.update(rel_error=rel, max_tensor_rel_error=worst, worst_tensor=worst_name, note="")
            if rel > tolerance:
                found = _find_fix(trainer, loaded, reference, params, empty, device, shift, local_items / total,
                                  tolerance)
                data["cause"], data["fix"] = found or ("unknown", (
                    "no other count, shift or reduction made the window equal the big batch: check "
                    "loss_fn's reduction ('mean'), count_items and shift_labels"))
            elif told_ranks == 0:
                data["pending"] = "no rank's share could tell the usual mistakes apart (rows of equal length, one part)"
        return data


def _weighted_pass(trainer: Any, batch: tuple[Any, Any] | None, weight: float, empty: Any) -> None:
    """One forward and backward of ``weight`` x loss (one row times 0 without a batch)."""
    for param in trainer.model.parameters():
        param.grad = None
    if batch is None:
        outputs = items.forward(trainer.model, items.to_device(empty, trainer.device))
        _zero(outputs).backward()
        return
    inputs, targets = items.to_device(batch[0], trainer.device), items.to_device(batch[1], trainer.device)
    loss = trainer.loss_fn(items.forward(trainer.model, inputs), targets)
    (loss * weight).backward()


def _zero(outputs: Any) -> torch.Tensor:
    return _zero_through(outputs)


def _local_grads(params: Params) -> list[torch.Tensor | None]:
    """Each parameter's gradient shard on this rank (a DTensor's local part), copied; cleared."""
    result = []
    for _, param in params:
        grad = param.grad
        if grad is not None and hasattr(grad, "to_local"):
            grad = grad.to_local()
        result.append(None if grad is None else grad.detach().double().clone())
        param.grad = None
    return result


def _sharded_errors(
    params: Params, accumulated: list[torch.Tensor | None], reference: list[torch.Tensor | None],
    device: torch.device,
) -> tuple[float, float, str | None]:
    """||a - b|| / ||b|| over every rank's shards (one all-reduce of each tensor's two sums),
    the largest per-tensor one and its name."""
    sums: list[float] = []
    for a, b in zip(accumulated, reference, strict=True):
        if a is None and b is None:
            sums += [0.0, 0.0]
            continue
        a64 = a if a is not None else torch.zeros_like(b)  # type: ignore[arg-type]
        b64 = b if b is not None else torch.zeros_like(a64)
        sums += [float((a64 - b64).square().sum()), float(b64.square().sum())]
    reduced = distributed.all_reduce_sum(sums, device).tolist()
    diffs, refs = reduced[0::2], reduced[1::2]
    per_tensor = [_ratio(d, r) for d, r in zip(diffs, refs, strict=True)]
    worst = max(range(len(per_tensor)), key=per_tensor.__getitem__) if per_tensor else None
    return (_ratio(sum(diffs), sum(refs)), per_tensor[worst] if worst is not None else 0.0,
            params[worst][0] if worst is not None else None)


def _ratio(diff_sq: float, ref_sq: float) -> float:
    if ref_sq == 0:
        return 0.0 if diff_sq == 0 else math.inf
    return math.sqrt(diff_sq / ref_sq)


def _find_fix(
    trainer: Any, loaded: list[MicroBatch], reference: list[torch.Tensor | None], params: Params, empty: Any,
    device: torch.device, shift: bool, share: float, tolerance: float,
) -> tuple[str, str] | None:
    """The first other weighting whose sharded gradient equals the big batch's, tried by every
    rank in the same order with the same number of passes (collectives). The big batch of a
    rank's share weighs ``share`` = W_rank / W, so a weighting is the share's own (1 per part
    for a sum, c_i / C_rank for another count) times ``share``."""
    world = distributed.world_size()
    counts = [float(mb.items) for mb in loaded]
    candidates: list[tuple[str, str, list[float] | None]] = [
        ("reduction", "loss_fn returns a sum over the micro-batch, not a mean: use reduction='mean', "
         "or divide by the item count", [1.0] * len(loaded)),
    ]
    for cause, fix, counter in alternatives(trainer.loss_fn, trainer.ignore_index, shift):
        other = counts_of(counter, loaded) if loaded else []
        if other:
            other = [c / sum(other) for c in other] if sum(other) > 0 else None
        candidates.append((cause, fix, other))
    passes = max(distributed.gather_objects(len(loaded)) or [len(loaded)])
    for cause, fix, weights in candidates:
        unusable, differs = distributed.all_reduce_sum(
            [float(weights is None), float(weights is not None and bool(weights) and len(weights) > 1
                                           and not proportional(weights, counts))], device).tolist()
        if cause != "reduction" and (unusable > 0 or differs == 0):
            continue  # some rank cannot count so, or these counts weigh every share's parts alike
        for param in trainer.model.parameters():
            param.grad = None
        for index in range(passes):
            if index < len(loaded):
                mb = loaded[index]
                loss = trainer.loss_fn(items.forward(trainer.model, items.to_device(mb.inputs, trainer.device)),
                                       items.to_device(mb.targets, trainer.device))
                (loss * (weights[index] * share * world)).backward()  # type: ignore[index]
            else:
                _zero(items.forward(trainer.model, items.to_device(empty, trainer.device))).backward()
        if _sharded_errors(params, _local_grads(params), reference, device)[0] <= tolerance:
            return cause, fix
    return None

"""The exactness check: the first window's accumulated gradient against the big batch's.

    trainer = Trainer(model, optimizer, loss_fn=loss, accumulation_steps=4, verify_window=True)
    trainer.fit(loader)  # raises ExactnessError before the first step if the window is not exact

Rule 1 of docs/accumulation.md makes the window's gradient the big batch's only when the loss
is the mean over the items the trainer counts. The user's loss, ``count_items``, ``shift_labels``
and collate decide that, and nothing else can see it; so before the first optimizer step of a
fresh ``fit`` the trainer computes the first window's gradient twice and compares:

(a) the accumulated way, by the trainer's own ``WindowRunner`` (n_i / W weights, the same
    forward, loss and counts as training);
(b) the big batch: the window's micro-batches concatenated (or, when they cannot be, the
    window's samples collated by the loader's ``collate_fn``), one forward and backward.

Both in eval mode (dropout and BatchNorm batch statistics differ for reasons that are not
accumulation) and in fp32 whatever the job's precision. The relative error of the flattened
gradient must be at most ``TOLERANCE``. Above it, the fix named is the other weighting (a sum,
another count mode, the other label shift) whose re-run matches the big batch
(``verify_weights``). Equal is not "passed" where nothing could differ: a window of one
micro-batch is compared as two unequal parts, and parts whose counts weigh a row mean and a
token mean alike leave the check ``pending``, to be run again on a later window that can tell. Afterwards the model's modes, buffers, gradients and
every RNG are put back and the optimizer is never touched, so training is bitwise the same
as without the check. Under DDP each rank compares its own share of the window (the relative
error does not depend on the share's scale n_rank / W), and one object all-gather brings every
rank's result to all ranks (``_reduce_over_ranks``): they pass or fail together, rank 0
reports the worst rank's error with the fix a failing rank found; the check is ``partial``
(not passed; ``"strict"`` fails) while a rank with micro-batches could not check its share;
and a window that no rank's share can tell about but the ranks' micro-batches together can
(fewer micro-batches than ranks) is gathered and checked whole on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from accumcore import distributed, items
from accumcore.oom import OOM_ERRORS, release_memory
from accumcore.pad_batch import pad_concat, pad_id_of
from accumcore.peak_memory import cpu_peak_added
from accumcore.precision import Precision
from accumcore.rng import capture_rng_state, restore_rng_state
from accumcore.verify_sharded import check_sharded
from accumcore.verify_weights import (
    concat,
    find_fix,
    grads,
    inconclusive_reason,
    named_params,
    put_back,
    relative_errors,
    unequal_parts,
)
from accumcore.window import MicroBatch, WindowRunner

TOLERANCE = 1e-6  # relative, fp32: float32 rounding of a window sum is ~1e-7
# Where the gradient's terms cancel (a LoRA adapter's first step: its rows' terms sum to near
# nothing), float32 rounding alone can pass 1e-6. Past it, the big batch is run again with its
# micro-batches in reverse order (the same sum, another rounding): the tolerance becomes
# ROUND_OFF_FACTOR x that round-off, never above TOLERANCE_CAP (a real weighting mistake is
# 1e-3 and up: a sum for a mean, a mis-counted padding).
ROUND_OFF_FACTOR = 4.0
TOLERANCE_CAP = 1e-5
MODES = (False, True, "warn", "strict")
# Loss values this close are "the same" when naming the cause (fp32 forward passes).
_LOSS_MATCH = 1e-5


class ExactnessError(RuntimeError):
    """A window's accumulated gradient is not the big batch's (``verify_window=True``), or the
    check could not run (``verify_window="strict"``: ``cause == "not_run"``).

    The message names the cause (``cause``: ``"reduction"``, ``"count_items"``,
    ``"shift_labels"``, ``"batch_dependent"``, ``"unknown"`` or ``"not_run"``) and how to fix it;
    the first three only after a re-run with the fix matched the big batch."""

    def __init__(self, message: str, *, rel_error: float, tolerance: float, cause: str) -> None:
        super().__init__(message)
        self.rel_error = rel_error
        self.tolerance = tolerance
        self.cause = cause


def check_option(value: Any) -> bool | str:
    """``verify_window`` as given, or a ValueError naming the allowed values."""
    if value is False or value is True or value in ("warn", "strict"):
        return value
    raise ValueError(f"verify_window must be False, True, 'warn' or 'strict', got {value!r}")


@dataclass
class CheckResult:
    """What the check found on this rank (``rel_error`` None: not checked, ``note`` says why)."""

    rel_error: float | None = None
    max_tensor_rel_error: float | None = None
    worst_tensor: str | None = None
    item_counts: list[float] = field(default_factory=list)
    micro_batches: int = 0  # k of the window's N (a sub-window when the big batch does not fit)
    window_micro_batches: int = 0
    note: str = ""
    tolerance: float = TOLERANCE  # raised past its rounding for this model and data (_round_off)
    cause: str | None = None
    fix: str | None = None
    # Why the parts compared could not differ (one part, counts proportional to the rows'):
    # a pass then proves nothing and the check waits for a window that can tell.
    pending: str | None = None

    @property
    def items(self) -> float:
        return float(sum(self.item_counts))


def verify(trainer: Any, micro_batches: list[MicroBatch], first: bool) -> bool:
    """The trainer's one call, before a window runs: check, report (event ``exactness_check``),
    raise on failure unless ``trainer.verify_window == "warn"``. True while the check is
    ``pending``: then the trainer calls again on later windows (before steps 1, 2, 4, 8, ...),
    and such a window is compared only when its item counts can tell the usual mistakes apart
    (read from the counts already made; under DDP the ranks' counts are gathered and the
    window's counts over all ranks decide).

    Under DDP the verdict is agreed by every rank (``_reduce_over_ranks``): it fails where any
    rank fails, with that rank's cause and fix in rank 0's message; it is ``partial`` (and
    ``"strict"`` fails) while a rank with micro-batches could not check its share; and where no
    rank's own share can tell the mistakes apart (fewer micro-batches than ranks, one row each)
    but the window's micro-batches over all ranks can, they are gathered and every rank checks
    the whole window (``_check_gathered``)."""
    shift = bool(trainer.shift_labels)
    ddp = distributed.ddp_wrapped(trainer.model)
    sharded = bool(getattr(trainer, "sharded", False))
    parts: list[list[MicroBatch]] | None = None
    if ddp:
        parts = distributed.gather_objects(_count_parts(micro_batches))
    if not first:
        local = inconclusive_reason(micro_batches, trainer.loss_fn, trainer.ignore_index, shift) is None
        if parts is not None:
            local = any(inconclusive_reason(p, trainer.loss_fn, trainer.ignore_index, shift) is None for p in parts)
            local = local or _union_tells(parts, trainer.loss_fn, trainer.ignore_index, shift)
        elif sharded:  # every rank looks, or none (the check's passes are collectives)
            local = bool(distributed.all_reduce_sum([float(local)], distributed.comm_device(trainer.model))[0] > 0)
        if not local:
            return True
    kwargs: dict[str, Any] = {
        "memory_limit_bytes": trainer.verify_memory_limit_bytes, "ignore_index": trainer.ignore_index,
        "shift_labels": shift, "counter": trainer.count_items,
    }
    if sharded:
        data = _verdict(check_sharded(trainer, micro_batches, TOLERANCE))
    else:
        result = check_window(trainer.model, trainer.loss_fn, micro_batches, trainer.device, **kwargs)
        data = _reduce_over_ranks(trainer.model, result)
    if (parts is not None and data["status"] == "pending"
            and _union_tells(parts, trainer.loss_fn, trainer.ignore_index, shift)):
        data = _check_gathered(trainer, micro_batches, kwargs)
    data["step"] = trainer.global_step  # the window before this optimizer step
    passed = data["passed"]
    message = _message(data)
    if distributed.is_main_process():
        trainer.emit("exactness_check", message, data)
    if passed is False and trainer.verify_window in (True, "strict"):
        raise ExactnessError(message + ". Pass verify_window='warn' to train anyway",
                             rel_error=data["rel_error"], tolerance=data.get("tolerance", TOLERANCE),
                             cause=data["cause"] or "unknown")
    if data["status"] in ("skipped", "partial") and trainer.verify_window == "strict":
        raise ExactnessError(message + ". verify_window='strict' needs the check to run on every rank: fix "
                             "what the note says, or pass verify_window=True to train without it",
                             rel_error=math.nan, tolerance=TOLERANCE, cause="not_run")
    return data["status"] == "pending"


def _count_parts(micro_batches: list[MicroBatch]) -> list[MicroBatch]:
    """The window's micro-batches as counts and targets only (on the host), to gather."""
    return [MicroBatch(None, _host(mb.targets if mb.pending is None else mb.pending.targets),
                       float(mb.items), mb.samples) for mb in micro_batches]


def _union_tells(parts: list[list[MicroBatch]], loss_fn: Any, ignore_index: int, shift: bool) -> bool:
    union = [mb for rank_parts in parts for mb in rank_parts]
    return bool(union) and inconclusive_reason(union, loss_fn, ignore_index, shift) is None


def _host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        return {k: _host(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_host(v) for v in value)
    return value


def _check_gathered(trainer: Any, micro_batches: list[MicroBatch], kwargs: dict[str, Any]) -> dict[str, Any]:
    """DDP, no rank's share could tell: every rank's micro-batches of the window (loaded on
    the host, RNG states put back) gathered in rank order, and the whole window checked on
    every rank alike (the model is the same on every rank): one verdict, no further reduce."""
    rng = capture_rng_state()
    try:
        loaded = [MicroBatch(_host(i), _host(t), float(mb.items), mb.samples)
                  for mb in micro_batches for i, t in [mb.load()]]
    finally:
        restore_rng_state(rng)
    gathered = distributed.gather_objects(loaded) or [loaded]
    window = [mb for rank_batches in gathered for mb in rank_batches]
    result = check_window(trainer.model, trainer.loss_fn, window, trainer.device, **kwargs)
    data = _local_data(result)
    data.update(ranks_checked=len(gathered), ranks_with_data=sum(1 for g in gathered if g), gathered=True)
    data["note"] = "; ".join(filter(None, [
        f"the window's micro-batches of all {len(gathered)} ranks gathered (no rank's own share could "
        "tell the usual mistakes apart)", data["note"]]))
    return _verdict(data)


def check_window(
    model: torch.nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    micro_batches: list[MicroBatch],
    device: torch.device,
    *,
    memory_limit_bytes: int | None = None,
    ignore_index: int = -100,
    shift_labels: bool | None = None,
    counter: Callable[[Any, Any], Any] | None = None,
) -> CheckResult:
    """Compare the accumulated gradient of ``micro_batches`` with their big batch's.

    A window of one micro-batch is compared as two parts of unequal rows (``counter`` counts
    them; default: the trainer's inferred count), so a sum or a wrong count can show; a
    window whose parts cannot tell the usual mistakes apart leaves ``result.pending`` set.

    ``memory_limit_bytes``: the big batch's peak (fp32 forward and backward; on the CPU the
    profiler's allocator peak, on CUDA ``max_memory_allocated``) must stay below it, else the
    first k micro-batches that fit are checked (halving k, as the OOM back-off halves m). A
    CUDA out-of-memory error backs off the same way without a limit.
    Changes nothing the training run sees: modes, buffers, gradients and RNG states are put
    back, the optimizer is not used.
    """
    module = distributed.unwrap(model)
    params = named_params(module, loss_fn)
    result = CheckResult(window_micro_batches=len(micro_batches), tolerance=TOLERANCE)
    with put_back(module, params) as rng, torch.autocast(device.type, enabled=False):
        _compare(module, loss_fn, micro_batches, device, params, rng, result,
                 memory_limit_bytes, ignore_index, bool(shift_labels),
                 counter or items.ItemCounter(None, ignore_index, bool(shift_labels), loss_fn))
    return result


def _compare(
    module: torch.nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    micro_batches: list[MicroBatch],
    device: torch.device,
    params: list[tuple[str, torch.nn.Parameter]],
    rng: dict[str, Any],
    result: CheckResult,
    memory_limit_bytes: int | None,
    ignore_index: int,
    shift_labels: bool,
    counter: Callable[[Any, Any], Any],
) -> None:
    if not micro_batches:
        result.note = "this rank has no micro-batch in the window"
        return
    loaded = _load(micro_batches, rng)
    if float(sum(mb.items for mb in loaded)) == 0:
        result.note = "the window has no items (every target ignore_index): nothing to compare"
        return
    if len(loaded) == 1:  # its own big batch: compare two unequal parts of it instead
        loaded = unequal_parts(loaded[0], counter, loss_fn, ignore_index, shift_labels)
        micro_batches = []  # the parts re-join by concatenation; no sample indices needed
    # (b) the big batch, on the first k micro-batches that fit.
    k = len(loaded)
    while True:
        big, why_not = _big_batch(micro_batches[:k], loaded[:k], rng, pad_id_of(module), ignore_index)
        if big is None:
            result.note = f"skipped: {why_not}"
            return
        fits, big_loss = _big_backward(module, loss_fn, big, device, memory_limit_bytes)
        del big
        if fits:
            break
        for _, param in params:
            param.grad = None
        release_memory()
        if k <= 2:  # one micro-batch is its own big batch: nothing left to compare
            result.note = (
                "skipped: the big batch of two micro-batches does not fit in fp32"
                f"{f' within {memory_limit_bytes} bytes' if memory_limit_bytes else ''}"
            )
            return
        k = max(k // 2, 2)
    reference = grads(params)
    for _, param in params:
        param.grad = None
    # (a) the accumulated gradient, by the trainer's own window code in fp32.
    runner = WindowRunner(module, loss_fn, Precision("fp32", device), device, None)
    try:
        runner.run(loaded[:k])
    except OOM_ERRORS:
        result.note = "skipped: the window's micro-batches do not fit in fp32 (the job trains in lower precision)"
        return
    accumulated = grads(params)
    for _, param in params:
        param.grad = None
    result.micro_batches = k
    result.item_counts = [float(mb.items) for mb in loaded[:k]]
    if not all(bool(torch.isfinite(g).all()) for g in (*accumulated, *reference) if g is not None):
        # Not a question of accumulation: training's own non-finite check (on_nonfinite) decides.
        result.note = "skipped: the first window's gradient is not finite (inf/NaN)"
        return
    result.rel_error, result.max_tensor_rel_error, result.worst_tensor = relative_errors(
        [name for name, _ in params], accumulated, reference)
    if not micro_batches:
        result.note = f"one micro-batch, compared as two parts of {loaded[0].samples} and {loaded[1].samples if len(loaded) > 1 else 0} rows"
    elif k < len(loaded):
        result.note = (f"sub-window: the first {k} of {len(loaded)} micro-batches (the big batch "
                       "of the whole window does not fit)")
    if result.rel_error > TOLERANCE:
        floor = _round_off(module, loss_fn, loaded[:k], device, params, reference, pad_id_of(module),
                           ignore_index)
        if floor is not None and floor > 0:
            result.tolerance = min(max(TOLERANCE, ROUND_OFF_FACTOR * floor), TOLERANCE_CAP)
            rounding = (f"tolerance {result.tolerance:.2g}: the big batch's own float32 rounding here is "
                        f"{floor:.2g} (its micro-batches in reverse order)")
            result.note = f"{result.note}; {rounding}" if result.note else rounding
    if result.rel_error > result.tolerance:
        found = find_fix(module, loss_fn, loaded[:k], reference, params, device, ignore_index,
                         shift_labels, result.tolerance)
        result.cause, result.fix = found or _unexplained(module, loss_fn, loaded[:k], big_loss, device)
    else:
        result.pending = inconclusive_reason(loaded[:k], loss_fn, ignore_index, shift_labels)


def _round_off(
    module: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], loaded: list[MicroBatch],
    device: torch.device, params: list[tuple[str, torch.nn.Parameter]], reference: list[torch.Tensor | None],
    pad_id: int, ignore_index: int,
) -> float | None:
    """The big batch's relative distance from itself with its micro-batches in reverse order:
    the same rows, so the same gradient but for float32 rounding; None when it cannot be
    formed as one batch without the loader (nothing is re-collated: a random transform would
    draw again)."""
    big, _ = _big_batch([], loaded[::-1], {}, pad_id, ignore_index)
    if big is None:
        return None
    for _, param in params:
        param.grad = None
    _big_backward(module, loss_fn, big, device, None)
    del big
    again = grads(params)
    for _, param in params:
        param.grad = None
    return relative_errors([name for name, _ in params], again, reference)[0]


def _load(micro_batches: list[MicroBatch], rng: dict[str, Any]) -> list[MicroBatch]:
    """The micro-batches with their inputs loaded, once: both sides then see the same data
    (random transforms draw from the RNG states the training window starts from)."""
    restore_rng_state(rng)
    loaded = []
    for mb in micro_batches:
        inputs, targets = mb.load()
        loaded.append(MicroBatch(inputs, targets, mb.items, mb.samples))
    return loaded


def _big_batch(
    micro_batches: list[MicroBatch], loaded: list[MicroBatch], rng: dict[str, Any], pad_id: int,
    ignore_index: int,
) -> tuple[tuple[Any, Any] | None, str]:
    """(inputs, targets) of the micro-batches as one batch, or None and the reason."""
    try:
        return (concat([mb.inputs for mb in loaded]), concat([mb.targets for mb in loaded])), ""
    except (RuntimeError, TypeError, ValueError) as exc:
        reason = str(exc).splitlines()[0]
    pending = [mb.pending for mb in micro_batches]
    if pending and all(p is not None for p in pending):
        # The loader gives the samples' indices: collate them as one batch, as the loader's
        # collate_fn would (from the same RNG states, for random transforms).
        source = pending[0].source  # type: ignore[union-attr]
        indices = [i for p in pending for i in p.indices]  # type: ignore[union-attr]
        restore_rng_state(rng)
        return items.unpack(source.load(indices)), ""
    if all(isinstance(mb.inputs, Mapping) for mb in loaded):
        # Keyword batches padded per micro-batch, without indices: padded again to the
        # window's longest row (targets outside the mapping as labels are).
        try:
            big = pad_concat([mb.inputs for mb in loaded], pad_id, ignore_index)
            if all(mb.targets is mb.inputs.get("labels") for mb in loaded):
                return (big, big.get("labels")), ""
            targets = pad_concat([{"labels": mb.targets} for mb in loaded], pad_id, ignore_index)["labels"]
            return (big, targets), ""
        except ValueError as exc:
            reason = str(exc)
    why = ""
    if all(isinstance(mb.inputs, tuple | list | torch.Tensor) for mb in loaded):
        # Positional batches are not padded again: nothing says which tensor is an attention
        # mask or what pads a row, and without a mask padding changes what most models compute.
        why = ("; positional (tuple) batches padded per micro-batch are not padded again, since "
               "nothing names their attention mask and pad value (a mapping with input_ids, "
               "attention_mask and labels is)")
    return None, (
        f"the micro-batches cannot be concatenated ({reason}) and the loader gives no sample "
        "indices to collate the window as one batch: a loader with a collate_fn of its own "
        "(make_loader(collate_fn=...) too) is read a window ahead, without indices, unless it "
        f"has a targets_for(indices) hook{why}; give the DataLoader a targets_for(indices) hook "
        "(loader.targets_for = lambda indices: the targets collate_fn makes of those samples; "
        "accumcore.window_source) so the check can use its collate_fn"
    )


def _big_backward(
    module: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], big: tuple[Any, Any],
    device: torch.device, memory_limit_bytes: int | None,
) -> tuple[bool, float]:
    """One forward and backward of the plain loss; (fits, loss value)."""
    values: list[float] = []

    def run() -> None:
        inputs, targets = items.to_device(big[0], device), items.to_device(big[1], device)
        loss = loss_fn(items.forward(module, inputs), targets)
        loss.backward()
        values.append(float(loss.detach()))

    try:
        if memory_limit_bytes is None:
            run()
            return True, values[0]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            run()
            peak = int(torch.cuda.max_memory_allocated(device))
        else:
            peak = cpu_peak_added(run)
        return peak <= memory_limit_bytes, values[0]
    except OOM_ERRORS:
        return False, math.nan


def _unexplained(
    module: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], loaded: list[MicroBatch],
    big_loss: float, device: torch.device,
) -> tuple[str, str]:
    """No other weighting passes: the loss values say whether the model depends on its batch."""
    with torch.no_grad():
        losses = [float(loss_fn(items.forward(module, items.to_device(mb.inputs, device)),
                                items.to_device(mb.targets, device))) for mb in loaded]
    counts = [float(mb.items) for mb in loaded]
    mean = sum(c * v for c, v in zip(counts, losses, strict=True)) / max(sum(counts), 1e-30)
    if abs(mean - big_loss) <= _LOSS_MATCH * max(abs(big_loss), 1e-12):
        return "batch_dependent", (
            "the loss values agree but the gradients do not: in eval mode the model's output "
            "for a sample depends on the rest of its batch (padding to the batch's longest "
            "sequence, a collate that pads differently, batch statistics); make it per-sample")
    return "unknown", (
        "the loss is not the mean over the items the trainer counts, and no other count, shift "
        "or reduction made the window equal the big batch: check loss_fn's reduction ('mean'), "
        "count_items ('tokens', 'rows' or a function counting what the loss averages over) and "
        "shift_labels (True when the model scores labels[..., 1:])")


def _local_data(result: CheckResult) -> dict[str, Any]:
    return {
        "rel_error": result.rel_error, "max_tensor_rel_error": result.max_tensor_rel_error,
        "worst_tensor": result.worst_tensor, "tolerance": result.tolerance, "items": result.items,
        "item_counts": result.item_counts, "micro_batches": result.micro_batches,
        "window_micro_batches": result.window_micro_batches, "note": result.note,
        "cause": result.cause, "fix": result.fix, "precision": "fp32", "mode": "eval",
        "pending": result.pending,
    }


def _reduce_over_ranks(model: torch.nn.Module, result: CheckResult) -> dict[str, Any]:
    """The event's data: this rank's result, or under DDP every rank's merged, the same on
    every rank (one object all-gather of each rank's result): W and the micro-batches summed,
    the worst rank's error, the cause and fix of a failing rank that found one (so rank 0's
    message names it), ``ranks_checked`` of ``ranks_with_data``, and status ``partial`` (not
    passed) while a rank with micro-batches could not check, with its reason in the note."""
    data = _local_data(result)
    ranks = distributed.gather_objects(data) if distributed.ddp_wrapped(model) else None
    if ranks is None:
        return _verdict(data)
    checked = [(r, d) for r, d in enumerate(ranks) if d["rel_error"] is not None]
    with_data = [r for r, d in enumerate(ranks) if d["window_micro_batches"] > 0]
    merged = dict(data)
    merged.update(
        items=float(sum(d["items"] for d in ranks)),
        item_counts=[c for d in ranks for c in d["item_counts"]],
        micro_batches=sum(d["micro_batches"] for d in ranks),
        window_micro_batches=sum(d["window_micro_batches"] for d in ranks),
        ranks_checked=len(checked), ranks_with_data=len(with_data), cause=None, fix=None,
        worst_tensor=None, pending=None,
    )
    unchecked = [r for r in with_data if ranks[r]["rel_error"] is None]
    notes = [f"rank {r}: {ranks[r]['note']}" for r in unchecked]
    notes += [f"rank {r}: {d['note']}" for r, d in checked if d["note"]]
    merged["note"] = "; ".join(notes) if len(ranks) > 1 and notes else data["note"]
    if not checked:
        merged["note"] = merged["note"] or "no rank has a micro-batch in the window"
        return _verdict(merged)
    # The worst rank: the furthest past (or nearest to) its own tolerance.
    worst_rank, worst = max(checked, key=lambda item: item[1]["rel_error"] / item[1]["tolerance"])
    merged.update(rel_error=worst["rel_error"], worst_rank=worst_rank, worst_tensor=worst["worst_tensor"],
                  tolerance=worst["tolerance"],
                  max_tensor_rel_error=max(d["max_tensor_rel_error"] or 0.0 for _, d in checked))
    failing = [(r, d) for r, d in checked if d["rel_error"] > d["tolerance"]]
    named = [(r, d) for r, d in failing if d["fix"]]
    if named:
        merged.update(cause=named[0][1]["cause"], fix=named[0][1]["fix"], cause_rank=named[0][0])
    if not failing and not any(d["pending"] is None for _, d in checked):
        merged["pending"] = next(d["pending"] for _, d in checked)  # no rank could tell
    merged["unchecked_ranks"] = unchecked
    return _verdict(merged)


def _verdict(data: dict[str, Any]) -> dict[str, Any]:
    """``passed`` and ``status`` from the (merged) result: ``skipped`` (not compared),
    ``failed``, ``pending`` (equal where nothing could differ), ``partial`` (passed on the
    ranks that checked, not on every rank with micro-batches) or ``passed``."""
    rel = data["rel_error"]
    failed = rel is not None and rel > data.get("tolerance", TOLERANCE)
    data["status"] = ("skipped" if rel is None else "failed" if failed
                      else "pending" if data["pending"] else "partial" if data.get("unchecked_ranks")
                      else "passed")
    # Equal where nothing could differ, or on some ranks only, proves nothing: not "passed".
    data["passed"] = False if failed else True if data["status"] == "passed" else None
    return data


def _message(data: dict[str, Any]) -> str:
    rel = data["rel_error"]
    window = (f"W = {data['items']:g} items over {data['micro_batches']} of "
              f"{data['window_micro_batches']} micro-batches")
    if rel is None:
        return f"exactness check not run: {data['note']}"
    extra = f"; {data['note']}" if data["note"] else ""
    name = "first window" if not data.get("step") else f"window {data['step'] + 1}"
    if data["status"] == "pending":
        return (f"exactness check pending: {data['pending']}. The {name} equals its big batch (relative "
                f"error {rel:.2g}; {window}{extra}) but could not differ; checking the next windows until one can")
    if data["status"] == "partial":
        return (f"exactness check partial: the {name} equals its big batch on {data['ranks_checked']} of "
                f"{data['ranks_with_data']} ranks with micro-batches (relative error {rel:.2g}; {window}); "
                f"not checked on rank(s) {', '.join(map(str, data['unchecked_ranks']))}{extra}")
    if data["passed"]:
        return (f"{name} = big batch: relative error {rel:.2g} (tolerance {data.get('tolerance', TOLERANCE):.2g}; "
                f"{window}){extra}")
    where = f" (worst tensor {data['worst_tensor']})" if data.get("worst_tensor") else ""
    rank = f"rank {data['worst_rank']} fails; " if data.get("worst_rank") is not None else ""
    found = f" (found on rank {data['cause_rank']})" if data.get("cause_rank") else ""
    cause = f": cause {data['cause']}{found}: {data['fix']}" if data["fix"] else (
        f": {rank}check loss_fn's reduction ('mean'), count_items and shift_labels")
    return (f"{name} != big batch: relative error {rel:.2g} > tolerance {data.get('tolerance', TOLERANCE):.2g}"
            f"{where}, {window}{extra}{cause}")

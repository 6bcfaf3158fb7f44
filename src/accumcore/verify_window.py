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
error does not depend on the share's scale n_rank / W), and one all-reduce brings every
rank's error and the global W to all ranks: they pass or fail together, rank 0 reports.
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
from accumcore.verify_weights import find_fix, grads, inconclusive_reason, relative_errors
from accumcore.window import MicroBatch, WindowRunner

TOLERANCE = 1e-6  # relative, fp32: float32 rounding of a window sum is ~1e-7
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
    (read from the counts already made; under DDP one small all-reduce of that flag)."""
    shift = bool(trainer.shift_labels)
    if not first:
        local = inconclusive_reason(micro_batches, trainer.loss_fn, trainer.ignore_index, shift) is None
        if distributed.ddp_wrapped(trainer.model):
            local = bool(distributed.all_reduce_sum([float(local)], distributed.comm_device(trainer.model))[0] > 0)
        if not local:
            return True
    result = check_window(
        trainer.model, trainer.loss_fn, micro_batches, trainer.device,
        memory_limit_bytes=trainer.verify_memory_limit_bytes,
        ignore_index=trainer.ignore_index, shift_labels=shift, counter=trainer.count_items,
    )
    data = _reduce_over_ranks(trainer.model, result)
    data["step"] = trainer.global_step  # the window before this optimizer step
    passed = data["passed"]
    message = _message(data)
    if distributed.is_main_process():
        trainer.emit("exactness_check", message, data)
    if passed is False and trainer.verify_window in (True, "strict"):
        raise ExactnessError(message + ". Pass verify_window='warn' to train anyway",
                             rel_error=data["rel_error"], tolerance=TOLERANCE, cause=data["cause"] or "unknown")
    if data["status"] == "skipped" and trainer.verify_window == "strict":
        raise ExactnessError(message + ". verify_window='strict' needs the check to run: fix what the "
                             "note says, or pass verify_window=True to train without it",
                             rel_error=math.nan, tolerance=TOLERANCE, cause="not_run")
    return data["status"] == "pending"


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
    params = _named_params(module, loss_fn)
    saved_grads = [p.grad for _, p in params]
    modes = [(m, m.training) for m in module.modules()]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    rng = capture_rng_state()
    result = CheckResult(window_micro_batches=len(micro_batches))
    try:
        for _, param in params:
            param.grad = None
        module.eval()
        with torch.autocast(device.type, enabled=False):
            _compare(module, loss_fn, micro_batches, device, params, rng, result,
                     memory_limit_bytes, ignore_index, bool(shift_labels),
                     counter or items.ItemCounter(None, ignore_index, bool(shift_labels), loss_fn))
    finally:
        for (_, param), grad in zip(params, saved_grads, strict=True):
            param.grad = grad
        for module_, training in modes:
            module_.training = training
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        restore_rng_state(rng)
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
        loaded = _unequal_parts(loaded[0], counter, loss_fn, ignore_index, shift_labels)
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
        found = find_fix(module, loss_fn, loaded[:k], reference, params, device, ignore_index,
                         shift_labels, TOLERANCE)
        result.cause, result.fix = found or _unexplained(module, loss_fn, loaded[:k], big_loss, device)
    else:
        result.pending = inconclusive_reason(loaded[:k], loss_fn, ignore_index, shift_labels)


def _named_params(module: torch.nn.Module, loss_fn: Any) -> list[tuple[str, torch.nn.Parameter]]:
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if isinstance(loss_fn, torch.nn.Module):  # a loss with learnable weights trains too
        named += [(f"loss_fn.{n}", p) for n, p in loss_fn.named_parameters() if p.requires_grad]
    return named


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


def concat(values: list[Any]) -> Any:
    """Batches of the same structure joined along the first dimension (ValueError if not)."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            raise ValueError("a 0-d tensor in the batch has no batch dimension")
        return torch.cat(values, dim=0)
    if isinstance(first, Mapping):
        if any(not isinstance(v, Mapping) or v.keys() != first.keys() for v in values):
            raise ValueError("the micro-batches' mappings have different keys")
        return {key: concat([v[key] for v in values]) for key in first}
    if isinstance(first, tuple | list):
        if any(len(v) != len(first) for v in values):
            raise ValueError("the micro-batches' sequences have different lengths")
        return type(first)(concat([v[i] for v in values]) for i in range(len(first)))
    if all(v == first for v in values):
        return first  # the same constant in every micro-batch (None, a flag)
    raise ValueError(f"values of type {type(first).__name__} differ between micro-batches")


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


def _unequal_parts(
    mb: MicroBatch, counter: Callable[[Any, Any], Any], loss_fn: Any, ignore_index: int, shift: bool
) -> list[MicroBatch]:
    """One micro-batch as two parts of unequal rows, split where their counts can tell a row
    mean from a token mean if any split can (else at the first row); itself when it has one row."""
    rows = mb.samples
    if rows < 2:
        return [mb]
    best: list[MicroBatch] = []
    for cut in dict.fromkeys((rows // 3 or 1, 1, rows - 1, rows // 2)):  # unequal first
        parts = [MicroBatch(i, t, items.normalise_count(counter(i, t)), items.first_dim(i))
                 for i, t in zip(items.split(mb.inputs, [cut]), items.split(mb.targets, [cut]), strict=True)]
        if inconclusive_reason(parts, loss_fn, ignore_index, shift) is None:
            return parts
        best = best or parts
    return best


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


def _reduce_over_ranks(model: torch.nn.Module, result: CheckResult) -> dict[str, Any]:
    """The event's data: this rank's result, or under DDP the worst rank's with the global W
    (one all-reduce: each rank writes 1 + its errors into its own slots, 0 when unchecked)."""
    world, rank = distributed.world_size(), distributed.rank()
    counts = result.item_counts
    data: dict[str, Any] = {
        "rel_error": result.rel_error, "max_tensor_rel_error": result.max_tensor_rel_error,
        "worst_tensor": result.worst_tensor, "tolerance": TOLERANCE, "items": result.items,
        "item_counts": counts, "micro_batches": result.micro_batches,
        "window_micro_batches": result.window_micro_batches, "note": result.note,
        "cause": result.cause, "fix": result.fix, "precision": "fp32", "mode": "eval",
        "pending": result.pending,
    }
    if distributed.ddp_wrapped(model):
        slots = [0.0] * (2 * world)
        if result.rel_error is not None:
            slots[rank] = 1.0 + result.rel_error
            slots[world + rank] = 1.0 + (result.max_tensor_rel_error or 0.0)
        # The last slot: ranks whose parts could tell the mistakes apart (one is enough: every
        # rank runs the same loss and counts).
        told = float(result.rel_error is not None and result.pending is None)
        reduced = distributed.all_reduce_sum([result.items, *slots, told], distributed.comm_device(model)).tolist()
        errors = [(e - 1.0, t - 1.0, r) for r, (e, t) in enumerate(zip(reduced[1:1 + world], reduced[1 + world:-1], strict=True)) if e > 0]
        if reduced[-1] > 0:
            data["pending"] = None
        elif errors and data["pending"] is None:
            data["pending"] = "no rank's parts could tell the usual mistakes apart"
        data["items"] = reduced[0]  # W over all ranks
        data["ranks_checked"] = len(errors)
        if errors:
            worst = max(errors)
            data.update(rel_error=worst[0], max_tensor_rel_error=max(t for _, t, _ in errors), worst_rank=worst[2])
            if worst[2] != rank:
                data["worst_tensor"] = None  # known on that rank only
            if result.rel_error is None or result.rel_error <= TOLERANCE:
                data.update(cause=None, fix=None)  # this rank passed: the cause is another's
    rel = data["rel_error"]
    data["passed"] = None if rel is None else bool(rel <= TOLERANCE)
    if data["passed"]:
        # Equal where nothing could differ proves nothing: not "passed" until a window can.
        data["passed"] = None if data["pending"] else True
    data["status"] = ("skipped" if rel is None else "failed" if rel > TOLERANCE
                      else "pending" if data["pending"] else "passed")
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
    if data["passed"]:
        return (f"{name} = big batch: relative error {rel:.2g} (tolerance {TOLERANCE:g}; "
                f"{window}){extra}")
    where = f" (worst tensor {data['worst_tensor']})" if data.get("worst_tensor") else ""
    rank = f"rank {data['worst_rank']} fails; " if data.get("worst_rank") is not None else ""
    cause = f": cause {data['cause']}: {data['fix']}" if data["fix"] else (
        f": {rank}check loss_fn's reduction ('mean'), count_items and shift_labels")
    return (f"{name} != big batch: relative error {rel:.2g} > tolerance {TOLERANCE:g}"
            f"{where}, {window}{extra}{cause}")

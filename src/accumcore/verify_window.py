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
gradient must be at most ``TOLERANCE``. Afterwards the model's modes, buffers, gradients and
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
from accumcore.peak_memory import cpu_peak_added
from accumcore.precision import Precision
from accumcore.rng import capture_rng_state, restore_rng_state
from accumcore.window import MicroBatch, WindowRunner

TOLERANCE = 1e-6  # relative, fp32: float32 rounding of a window sum is ~1e-7
MODES = (False, True, "warn")
# Loss values this close are "the same" when naming the cause (fp32 forward passes).
_LOSS_MATCH = 1e-5


class ExactnessError(RuntimeError):
    """The first window's accumulated gradient is not the big batch's (``verify_window=True``).

    The message names the likely cause (``cause``: ``"reduction"``, ``"count_items"``,
    ``"shift_labels"``, ``"batch_dependent"`` or ``"unknown"``) and how to fix it."""

    def __init__(self, message: str, *, rel_error: float, tolerance: float, cause: str) -> None:
        super().__init__(message)
        self.rel_error = rel_error
        self.tolerance = tolerance
        self.cause = cause


def check_option(value: Any) -> bool | str:
    """``verify_window`` as given, or a ValueError naming the allowed values."""
    if value is False or value is True or value == "warn":
        return value
    raise ValueError(f"verify_window must be False, True or 'warn', got {value!r}")


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

    @property
    def items(self) -> float:
        return float(sum(self.item_counts))


def check_first_window(trainer: Any, micro_batches: list[MicroBatch]) -> None:
    """The trainer's one call: check, report (event ``exactness_check``), raise on failure
    unless ``trainer.verify_window == "warn"``."""
    result = check_window(
        trainer.model, trainer.loss_fn, micro_batches, trainer.device,
        memory_limit_bytes=trainer.verify_memory_limit_bytes,
        ignore_index=trainer.ignore_index, shift_labels=trainer.shift_labels,
    )
    data = _reduce_over_ranks(trainer.model, result)
    passed = data["passed"]
    message = _message(data)
    if distributed.is_main_process():
        trainer._emit("exactness_check", message, data)
    if passed is False and trainer.verify_window is True:
        raise ExactnessError(message + ". Pass verify_window='warn' to train anyway",
                             rel_error=data["rel_error"], tolerance=TOLERANCE, cause=data["cause"] or "unknown")


def check_window(
    model: torch.nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    micro_batches: list[MicroBatch],
    device: torch.device,
    *,
    memory_limit_bytes: int | None = None,
    ignore_index: int = -100,
    shift_labels: bool | None = None,
) -> CheckResult:
    """Compare the accumulated gradient of ``micro_batches`` with their big batch's.

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
                     memory_limit_bytes, ignore_index, shift_labels)
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
    shift_labels: bool | None,
) -> None:
    if not micro_batches:
        result.note = "this rank has no micro-batch in the first window"
        return
    loaded = _load(micro_batches, rng)
    if float(sum(mb.items for mb in loaded)) == 0:
        result.note = "the first window has no items (every target ignore_index): nothing to compare"
        return
    # (b) the big batch, on the first k micro-batches that fit.
    k = len(loaded)
    while True:
        big, why_not = _big_batch(micro_batches[:k], loaded[:k], rng)
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
    reference = _grads(params)
    for _, param in params:
        param.grad = None
    # (a) the accumulated gradient, by the trainer's own window code in fp32.
    runner = WindowRunner(module, loss_fn, Precision("fp32", device), device, None)
    try:
        runner.run(loaded[:k])
    except OOM_ERRORS:
        result.note = "skipped: the window's micro-batches do not fit in fp32 (the job trains in lower precision)"
        return
    accumulated = _grads(params)
    for _, param in params:
        param.grad = None
    result.micro_batches = k
    result.item_counts = [float(mb.items) for mb in loaded[:k]]
    if not all(bool(torch.isfinite(g).all()) for g in (*accumulated, *reference) if g is not None):
        # Not a question of accumulation: training's own non-finite check (on_nonfinite) decides.
        result.note = "skipped: the first window's gradient is not finite (inf/NaN)"
        return
    result.rel_error, result.max_tensor_rel_error, result.worst_tensor = _relative_errors(
        [name for name, _ in params], accumulated, reference)
    if len(loaded) == 1:
        result.note = "a window of one micro-batch is its own big batch"
    elif k < len(loaded):
        result.note = (f"sub-window: the first {k} of {len(loaded)} micro-batches (the big batch "
                       "of the whole window does not fit)")
    if result.rel_error > TOLERANCE:
        result.cause, result.fix = _diagnose(module, loss_fn, loaded[:k], big_loss, device,
                                             ignore_index, shift_labels)


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
    micro_batches: list[MicroBatch], loaded: list[MicroBatch], rng: dict[str, Any]
) -> tuple[tuple[Any, Any] | None, str]:
    """(inputs, targets) of the micro-batches as one batch, or None and the reason."""
    try:
        return (concat([mb.inputs for mb in loaded]), concat([mb.targets for mb in loaded])), ""
    except (RuntimeError, TypeError, ValueError) as exc:
        reason = str(exc).splitlines()[0]
    pending = [mb.pending for mb in micro_batches]
    if all(p is not None for p in pending) and pending:
        # The loader gives the samples' indices: collate them as one batch, as the loader's
        # collate_fn would (from the same RNG states, for random transforms).
        source = pending[0].source  # type: ignore[union-attr]
        indices = [i for p in pending for i in p.indices]  # type: ignore[union-attr]
        restore_rng_state(rng)
        return items.unpack(source.load(indices)), ""
    return None, (
        f"the micro-batches cannot be concatenated ({reason}) and the loader gives no sample "
        "indices to collate the window as one batch: give the DataLoader a targets_for(indices) "
        "hook (accumcore.window_source) so the check can use its collate_fn"
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


def _grads(params: list[tuple[str, torch.nn.Parameter]]) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for _, p in params]


def _relative_errors(
    names: list[str], accumulated: list[torch.Tensor | None], reference: list[torch.Tensor | None]
) -> tuple[float, float, str | None]:
    """(||a - b|| / ||b|| over all gradients, the largest per-tensor one, that tensor's name),
    in float64; a missing gradient counts as zeros."""
    diff_sq = ref_sq = 0.0
    worst, worst_name = 0.0, None
    for name, a, b in zip(names, accumulated, reference, strict=True):
        if a is None and b is None:
            continue
        a64 = a.double() if a is not None else torch.zeros_like(b, dtype=torch.float64)  # type: ignore[arg-type]
        b64 = b.double() if b is not None else torch.zeros_like(a64)
        d, r = float((a64 - b64).square().sum()), float(b64.square().sum())
        diff_sq, ref_sq = diff_sq + d, ref_sq + r
        tensor_error = _ratio(d, r)
        if tensor_error > worst or worst_name is None:
            worst, worst_name = tensor_error, name
    return _ratio(diff_sq, ref_sq), worst, worst_name


def _ratio(diff_sq: float, ref_sq: float) -> float:
    if ref_sq == 0:
        return 0.0 if diff_sq == 0 else math.inf
    return math.sqrt(diff_sq / ref_sq)


def _diagnose(
    module: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], loaded: list[MicroBatch],
    big_loss: float, device: torch.device, ignore_index: int, shift_labels: bool | None,
) -> tuple[str, str]:
    """The likely cause and its fix, from the loss values: the big batch's loss is the mean of
    the micro-batches' losses weighted by what the loss really averages over."""
    with torch.no_grad():
        losses = [float(loss_fn(items.forward(module, items.to_device(mb.inputs, device)),
                                items.to_device(mb.targets, device))) for mb in loaded]
    counts = [float(mb.items) for mb in loaded]

    def matches(weights: list[float]) -> bool:
        total = sum(weights)
        if total <= 0:
            return False
        mean = sum(w * v for w, v in zip(weights, losses, strict=True)) / total
        return abs(mean - big_loss) <= _LOSS_MATCH * max(abs(big_loss), 1e-12)

    if len(losses) > 1 and abs(sum(losses) - big_loss) <= _LOSS_MATCH * max(abs(big_loss), 1e-12):
        return "reduction", (
            "loss_fn returns a sum over the micro-batch, not a mean (the big batch's loss is the "
            "sum of the micro-batches' losses): use reduction='mean', or divide by the item count")
    for shift in (not bool(shift_labels), bool(shift_labels)):
        for mode in ("tokens", "rows"):
            try:
                counter = items.ItemCounter(mode, ignore_index, shift, loss_fn)
                weights = [float(items.normalise_count(counter(mb.inputs, mb.targets))) for mb in loaded]
            except (TypeError, ValueError):
                continue
            if _proportional(weights, counts) or not matches(weights):
                continue
            if shift != bool(shift_labels):
                return "shift_labels", (
                    f"the loss scores labels{'[..., 1:]' if shift else ' unshifted'} but the trainer "
                    f"counts them {'unshifted' if shift else 'shifted'}: pass "
                    f"Trainer(shift_labels={shift}) (spec: set it in the model's options)")
            return "count_items", (
                f"the loss averages over {'samples' if mode == 'rows' else 'every non-ignored target'} "
                f"but the trainer counts other items: pass Trainer(count_items={mode!r}) or "
                "count_items=fn(inputs, targets) counting what the loss averages over")
    if matches(counts):
        return "batch_dependent", (
            "the loss values agree but the gradients do not: in eval mode the model's output "
            "for a sample depends on the rest of its batch (padding to the batch's longest "
            "sequence, a collate that pads differently, batch statistics); make it per-sample")
    return "unknown", (
        "the loss is not the mean over the items the trainer counts: check loss_fn's "
        "reduction ('mean'), count_items ('tokens', 'rows' or a function counting what the loss "
        "averages over) and shift_labels (True when the model scores labels[..., 1:])")


def _proportional(a: list[float], b: list[float]) -> bool:
    total_a, total_b = sum(a), sum(b)
    if total_a <= 0 or total_b <= 0:
        return False
    return all(abs(x / total_a - y / total_b) <= 1e-12 for x, y in zip(a, b, strict=True))


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
    }
    if distributed.ddp_wrapped(model):
        slots = [0.0] * (2 * world)
        if result.rel_error is not None:
            slots[rank] = 1.0 + result.rel_error
            slots[world + rank] = 1.0 + (result.max_tensor_rel_error or 0.0)
        reduced = distributed.all_reduce_sum([result.items, *slots], distributed.comm_device(model)).tolist()
        errors = [(e - 1.0, t - 1.0, r) for r, (e, t) in enumerate(zip(reduced[1:1 + world], reduced[1 + world:], strict=True)) if e > 0]
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
    return data


def _message(data: dict[str, Any]) -> str:
    rel = data["rel_error"]
    window = (f"W = {data['items']:g} items over {data['micro_batches']} of "
              f"{data['window_micro_batches']} micro-batches")
    if rel is None:
        return f"exactness check not run: {data['note']}"
    extra = f"; {data['note']}" if data["note"] else ""
    if data["passed"]:
        return (f"first window = big batch: relative error {rel:.2g} (tolerance {TOLERANCE:g}; "
                f"{window}){extra}")
    where = f" (worst tensor {data['worst_tensor']})" if data.get("worst_tensor") else ""
    rank = f"rank {data['worst_rank']} fails; " if data.get("worst_rank") is not None else ""
    cause = f": likely cause {data['cause']}: {data['fix']}" if data["fix"] else (
        f": {rank}check loss_fn's reduction ('mean'), count_items and shift_labels")
    return (f"first window != big batch: relative error {rel:.2g} > tolerance {TOLERANCE:g}"
            f"{where}, {window}{extra}{cause}")

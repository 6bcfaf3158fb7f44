"""The weightings the exactness check tells apart, and the re-run that names a fix.

The accumulated gradient equals the big batch's when each part's weight n_i / W is what the
loss really averages over. A comparison can only catch a wrong weighting where the right one
gives other weights: a window whose parts have the same count per row cannot tell a row mean
from a token mean (they are identical there), and a window of one part cannot tell anything.
``inconclusive_reason`` says when the window's counts cannot tell the usual mistakes apart
(the check then reports ``pending`` and waits for a window that can), and ``find_fix`` re-runs
the comparison with each other weighting and names the one that passes, if any.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from accumcore import items
from accumcore.rng import capture_rng_state, restore_rng_state
from accumcore.window import MicroBatch

Params = list[tuple[str, torch.nn.Parameter]]


def sequence_labels(targets: Any) -> bool:
    """Integer targets with a sequence dimension: rows and tokens (and a shift) count apart."""
    return (isinstance(targets, torch.Tensor) and targets.dim() >= 2
            and not (targets.is_floating_point() or targets.is_complex()))


def alternatives(loss_fn: Any, ignore_index: int, shift: bool) -> list[tuple[str, str, items.ItemCounter]]:
    """(cause, fix, counter) for each other count of integer sequence labels: per row, and
    tokens with the other shift."""
    return [
        ("count_items", "pass Trainer(count_items='rows'): the loss averages per-row means (each "
         "sample weighs the same), not every non-ignored target",
         items.ItemCounter("rows", ignore_index, shift, loss_fn)),
        ("count_items", "pass Trainer(count_items='tokens'): the loss averages over every "
         "non-ignored target, not per row",
         items.ItemCounter("tokens", ignore_index, shift, loss_fn)),
        ("shift_labels", f"pass Trainer(shift_labels={not shift}): the loss scores labels"
         f"{'[..., 1:]' if not shift else ' in place'}, the trainer counts them "
         f"{'in place' if not shift else 'shifted'} (spec: set it in the model's options)",
         items.ItemCounter("tokens", ignore_index, not shift, loss_fn)),
    ]


def counts_of(counter: Callable[[Any, Any], Any], parts: list[Any]) -> list[float] | None:
    """Each part's count by ``counter`` (None where it cannot count these targets)."""
    try:
        return [float(items.normalise_count(counter(p.inputs, p.targets if p.pending is None else p.pending.targets)))
                for p in parts]
    except (TypeError, ValueError):
        return None


def inconclusive_reason(parts: list[Any], loss_fn: Any, ignore_index: int, shift: bool) -> str | None:
    """Why comparing these parts could not catch a usual mistake, or None when it can: two
    parts with items, and for sequence labels counts per row, and with the other shift, that
    are not proportional to the trainer's (else both weigh the parts alike)."""
    counts = [float(p.items) for p in parts]
    if sum(1 for c in counts if c > 0) < 2:
        return "fewer than two parts with items: nothing weighs them differently"
    targets = parts[0].targets if parts[0].pending is None else parts[0].pending.targets
    if not sequence_labels(targets):
        return None
    for _cause, _fix, counter in alternatives(loss_fn, ignore_index, shift):
        other = counts_of(counter, parts)
        if other is not None and other != counts and proportional(other, counts):
            what = "a row mean and a token mean" if counter.mode == "rows" else "shifted and in-place labels"
            return (f"the parts' item counts ({', '.join(f'{c:g}' for c in counts)}) weigh them as "
                    f"{what} would (every row holds as many items), so a mistake there could not show")
    return None


def proportional(a: list[float], b: list[float]) -> bool:
    total_a, total_b = sum(a), sum(b)
    if total_a <= 0 or total_b <= 0:
        return False
    return all(abs(x / total_a - y / total_b) <= 1e-12 for x, y in zip(a, b, strict=True))


def find_fix(
    module: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], loaded: list[Any],
    reference: list[torch.Tensor | None], params: Params, device: torch.device, ignore_index: int,
    shift: bool, tolerance: float,
) -> tuple[str, str] | None:
    """(cause, fix) of the first other weighting whose accumulated gradient equals the big
    batch's within ``tolerance`` (re-run, not guessed), or None."""
    counts = [float(mb.items) for mb in loaded]
    candidates: list[tuple[str, str, list[float]]] = []
    if len(loaded) > 1:
        candidates.append(("reduction", "loss_fn returns a sum over the micro-batch, not a mean: use "
                           "reduction='mean', or divide by the item count", [1.0] * len(loaded)))
    if sequence_labels(loaded[0].targets):
        for cause, fix, counter in alternatives(loss_fn, ignore_index, shift):
            other = counts_of(counter, loaded)
            if other is not None and sum(other) > 0 and not proportional(other, counts):
                candidates.append((cause, fix, [c / sum(other) for c in other]))
    for cause, fix, weights in candidates:
        gradient = weighted_gradient(module, loss_fn, loaded, weights, params, device)
        if relative_errors([n for n, _ in params], gradient, reference)[0] <= tolerance:
            return cause, fix
    return None


def weighted_gradient(
    module: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], loaded: list[Any],
    weights: list[float], params: Params, device: torch.device,
) -> list[torch.Tensor | None]:
    """The gradient of sum_i weights[i] * loss(part i); the parameters' grads left empty."""
    for _, param in params:
        param.grad = None
    for mb, weight in zip(loaded, weights, strict=True):
        if weight == 0:
            continue
        loss = loss_fn(items.forward(module, items.to_device(mb.inputs, device)), items.to_device(mb.targets, device))
        (loss * weight).backward()
    result = grads(params)
    for _, param in params:
        param.grad = None
    return result


def grads(params: Params) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for _, p in params]


def relative_errors(
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


def named_params(module: torch.nn.Module, loss_fn: Any) -> list[tuple[str, torch.nn.Parameter]]:
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if isinstance(loss_fn, torch.nn.Module):  # a loss with learnable weights trains too
        named += [(f"loss_fn.{n}", p) for n, p in loss_fn.named_parameters() if p.requires_grad]
    return named


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


def unequal_parts(
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


@contextlib.contextmanager
def put_back(module: torch.nn.Module, params: Params) -> Iterator[dict[str, Any]]:
    """Run the check in eval mode with empty gradients; afterwards every gradient, module
    mode, buffer and RNG state is as it was. Yields the RNG states captured."""
    saved = [p.grad for _, p in params]
    modes = [(m, m.training) for m in module.modules()]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    rng = capture_rng_state()
    try:
        for _, param in params:
            param.grad = None
        module.eval()
        yield rng
    finally:
        for (_, param), grad in zip(params, saved, strict=True):
            param.grad = grad
        for module_, training in modes:
            module_.training = training
        with torch.no_grad():
            for buffer, copy in buffers:
                buffer.copy_(copy)
        restore_rng_state(rng)

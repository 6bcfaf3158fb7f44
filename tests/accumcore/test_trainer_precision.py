"""Mixed precision and clipping on the CPU: bf16 autocast, fp16 with a GradScaler, grad_norm.

fp16: a window with inf gradients is skipped (no optimizer step, no scheduler step), counted
and reported; the loss scale is a metric. Clipping uses the pre-clip norm, reported as
``grad_norm``, after unscaling.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from trainer_reference import (
    BadOnCalls,
    class_dataset,
    class_model,
    full_batch_gradients,
    relative_diff,
)

from accumcore import Callback, Trainer
from accumcore.data import make_loader


def _fp16_autocast_on_cpu() -> str | None:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            out = nn.Linear(2, 2)(torch.ones(1, 2))
        torch.amp.GradScaler("cpu")
    except (RuntimeError, AttributeError, TypeError) as error:
        return f"this torch build has no fp16 autocast/GradScaler on the CPU: {error}"
    return None if out.dtype == torch.float16 else "CPU autocast ignores float16 in this torch build"


FP16_UNAVAILABLE = _fp16_autocast_on_cpu()


class LinearDtypes(Callback):
    def __init__(self, model: nn.Module) -> None:
        self.dtypes: set[torch.dtype] = set()
        model[0].register_forward_hook(lambda _m, _i, out: self.dtypes.add(out.dtype))


def _fp32_reference(dataset, steps: int) -> nn.Module:
    model = class_model(torch.float32)
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
            accumulation_steps=2).fit(make_loader(dataset, 3), epochs=steps)
    return model


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_runs_low_precision_and_keeps_fp32_weights(precision: str) -> None:
    if precision == "fp16" and FP16_UNAVAILABLE:
        pytest.skip(FP16_UNAVAILABLE)
    dataset = class_dataset(12, torch.float32)
    model = class_model(torch.float32)
    seen = LinearDtypes(model)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2, precision=precision)
    history = trainer.fit(make_loader(dataset, 3), epochs=2)
    expected = torch.bfloat16 if precision == "bf16" else torch.float16
    assert seen.dtypes == {expected}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # Close to the fp32 run (low-precision matmuls), and every step taken.
    assert relative_diff(model, _fp32_reference(dataset, 2)) < 2e-2
    assert len(history.steps) == 4 and history.skipped_steps == 0
    if precision == "fp16":
        assert all(s["loss_scale"] == 65536.0 for s in history.steps)
    else:
        assert all("loss_scale" not in s for s in history.steps)


class Snapshots(Callback):
    def __init__(self) -> None:
        self.params: list[list[torch.Tensor]] = []
        self.events: list[str] = []

    def on_step(self, trainer, metrics) -> None:
        self.params.append([p.detach().clone() for p in trainer.model.parameters()])

    def on_event(self, trainer, kind, message, data) -> None:
        self.events.append(kind)


@pytest.mark.skipif(FP16_UNAVAILABLE is not None, reason=FP16_UNAVAILABLE or "")
def test_fp16_overflow_skips_the_step_and_the_scheduler() -> None:
    model = class_model(torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    snapshots = Snapshots()
    # 12 samples, m=3, N=2: two windows per epoch; the 3rd micro-batch is in window 2.
    trainer = Trainer(model, optimizer, loss_fn=BadOnCalls(float("inf"), {3}), accumulation_steps=2,
                      precision="fp16", scheduler=scheduler, callbacks=[snapshots])
    history = trainer.fit(make_loader(class_dataset(12, torch.float32), 3), epochs=2)
    assert history.skipped_steps == 1 and snapshots.events == ["fp16_step_skipped"]
    assert all(torch.equal(a, b) for a, b in zip(snapshots.params[0], snapshots.params[1], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(snapshots.params[1], snapshots.params[2], strict=True))
    scales = [s["loss_scale"] for s in history.steps]
    assert scales[1] == scales[0] / 2  # the scaler backed off on the overflow
    # Four windows, one skipped: the scheduler stepped three times.
    assert scheduler.last_epoch == 3 and optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    assert [s["lr"] for s in history.steps] == pytest.approx([0.1, 0.05, 0.05, 0.025])


def test_clipping_uses_and_reports_the_pre_clip_norm() -> None:
    dataset = class_dataset(8, torch.float64)
    model = class_model(torch.float64)
    reference = copy.deepcopy(model)
    grads, norm = full_batch_gradients(model, dataset)
    max_norm = norm / 4
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=4, grad_clip_norm=max_norm)
    history = trainer.fit(make_loader(dataset, 2, shuffle=False), epochs=1)
    assert history.steps[0]["grad_norm"] == pytest.approx(norm, rel=1e-12)
    for p, q, g in zip(model.parameters(), reference.parameters(), grads, strict=True):
        expected = q.detach() - 0.1 * g * (max_norm / (norm + 1e-6))
        assert torch.allclose(p, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_weight_as_the_backward_seed_gives_the_products_gradients_bitwise(dtype: torch.dtype) -> None:
    """``Precision.backward_weighted(loss, w)`` seeds the loss's backward with ``w`` instead of
    multiplying (float32/float64 losses): every gradient is bitwise the one of
    ``(loss * w).backward()``, for item weights n_i x world / W of many sizes (bfloat16 takes
    the product, and so must match too)."""
    from accumcore.precision import Precision

    generator = torch.Generator().manual_seed(0)
    precision = Precision("fp32", torch.device("cpu"))
    model = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)).to(dtype)
    for n_i, world, total in [(1, 1, 3), (7, 1, 29), (5, 2, 41), (8, 3, 1000003), (3, 1, 3)]:
        x = torch.randn(8, 16, generator=generator).to(dtype)
        y = torch.randint(0, 4, (8,), generator=generator)
        grads = []
        for seeded in (False, True):
            model.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            weight = n_i * world / total
            if seeded:
                precision.backward_weighted(loss, weight)
            else:
                (loss * weight).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_a_reused_backward_seed_is_never_written_into_by_autograd() -> None:
    """Micro-batches of one weight share one seed tensor. A loss that passes its gradient on
    untouched (``w + 0``, and ``w`` counted twice: autograd then adds gradients, and would
    steal or add into a tensor it held alone) still gets exactly ``weight`` per backward."""
    from accumcore.precision import Precision

    precision = Precision("fp32", torch.device("cpu"))
    leaf = torch.zeros((), dtype=torch.float64, requires_grad=True)
    for weight, expected in [(0.5, 0.5), (0.5, 1.0), (0.25, 1.25), (0.25, 1.5), (0.5, 2.0)]:
        precision.backward_weighted(leaf + 0, weight)
        assert float(leaf.grad) == expected
    twice = torch.zeros((), dtype=torch.float64, requires_grad=True)
    for weight, expected in [(0.5, 1.0), (0.5, 2.0), (0.5, 3.0)]:
        precision.backward_weighted((twice + 0) + (twice + 0), weight)
        assert float(twice.grad) == expected
    assert float(precision._seed_for(0.5, twice)) == 0.5

"""Windows that must not step: non-finite losses or gradients, and windows without items.

- ``on_nonfinite="fail"`` (the default) raises ``NonFiniteError`` naming the step, the first
  non-finite metric and the last checkpoint written with finite values; ``"skip"`` skips the
  optimizer and scheduler step with a ``nonfinite_step_skipped`` event, and fails after
  ``max_consecutive_skips`` skips in a row.
- A window whose targets are all ``ignore_index`` (W = 0) does not step the optimizer (SGD
  momentum would still move the weights) nor the scheduler, and emits ``empty_window``.
- A micro-batch without items whose count is a device tensor (forced here on the CPU) adds
  nothing: its 0/0 mean loss is not multiplied into the window (0/0 x 0 is still NaN), in
  training and in ``evaluate``.
All compared in float64 with the big-batch oracle of ``trainer_reference``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainer_reference import (
    BadOnCalls,
    TokenCrossEntropy,
    big_batch_training,
    class_dataset,
    class_loss_sum,
    class_model,
    max_abs_diff,
    token_dataset,
    token_loss_sum,
    token_model,
)

from accumcore import Callback, NonFiniteError, Trainer, load_checkpoint
from accumcore import items as items_module
from accumcore.data import make_loader
from accumcore.schedule import AccumulationSchedule


class SqrtAtZero(nn.Module):
    """A finite forward whose backward is infinite: sqrt'(0) = inf (a non-finite gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = class_model(torch.float64)
        self.gate = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + torch.sqrt(self.gate)


class Recorder(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict]] = []
        self.params: list[list[torch.Tensor]] = []

    def on_step(self, trainer, metrics) -> None:
        self.params.append([p.detach().clone() for p in trainer.model.parameters()])

    def on_event(self, trainer, kind, message, data) -> None:
        self.events.append((kind, message, data))


def _class_trainer(loss_fn, callbacks=(), **kwargs) -> tuple[Trainer, torch.optim.lr_scheduler.StepLR]:
    model = class_model(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    trainer = Trainer(model, optimizer, loss_fn=loss_fn, accumulation_steps=2, scheduler=scheduler,
                      callbacks=callbacks, **kwargs)
    return trainer, scheduler


def test_a_nan_loss_fails_the_run_naming_the_step_metric_and_last_checkpoint(tmp_path) -> None:
    # 12 samples, m=3, N=2: the 5th micro-batch is in window 3.
    trainer, _ = _class_trainer(BadOnCalls(math.nan, {5}), checkpoint_every=1, checkpoint_dir=tmp_path)
    with pytest.raises(NonFiniteError) as raised:
        trainer.fit(make_loader(class_dataset(12, torch.float64), 3), epochs=2)
    message = str(raised.value)
    assert "step 3" in message and "loss is nan" in message
    assert str(tmp_path / "2.pt") in message
    assert raised.value.step == 3 and raised.value.metric == "loss"
    assert "pass on_nonfinite='skip'" in message  # the default policy is told of the other
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["1.pt", "2.pt"]
    state = load_checkpoint(tmp_path / "2.pt")
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_a_non_finite_gradient_with_a_finite_loss_fails_too() -> None:
    model = SqrtAtZero()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2)
    with pytest.raises(NonFiniteError, match=r"step 1: grad_norm is (inf|nan).*no checkpoint"):
        trainer.fit(make_loader(class_dataset(8, torch.float64), 2), epochs=1)
    # Refused before the optimizer step: the weights are still finite.
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_skip_policy_skips_the_optimizer_and_scheduler_step_with_an_event() -> None:
    recorder = Recorder()
    trainer, scheduler = _class_trainer(BadOnCalls(math.nan, {5}), callbacks=[recorder], on_nonfinite="skip")
    history = trainer.fit(make_loader(class_dataset(12, torch.float64), 3), epochs=2)
    kinds = [kind for kind, _, _ in recorder.events]
    assert kinds == ["nonfinite_step_skipped"]
    assert recorder.events[0][2]["step"] == 3 and recorder.events[0][2]["metric"] == "loss"
    # Step 3 left the weights as step 2 did; step 4 moved them again.
    assert all(torch.equal(a, b) for a, b in zip(recorder.params[1], recorder.params[2], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(recorder.params[2], recorder.params[3], strict=True))
    # Four windows, one skipped: the scheduler stepped three times.
    assert scheduler.last_epoch == 3 and len(history.steps) == 4
    assert math.isnan(history.steps[2]["loss"]) and history.skipped_steps == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_skip_policy_fails_after_too_many_consecutive_skips() -> None:
    trainer, _ = _class_trainer(BadOnCalls(math.nan, set(range(3, 100))), on_nonfinite="skip", max_consecutive_skips=3)
    with pytest.raises(NonFiniteError, match="3 consecutive steps skipped") as raised:
        trainer.fit(make_loader(class_dataset(24, torch.float64), 3), epochs=2)
    assert trainer.global_step == 4  # 1 good step, then 3 skipped
    # The run skips already: the advice is the rest, not to pass the policy it has.
    assert "on_nonfinite" not in str(raised.value) and "grad_clip_norm" in str(raised.value)


def test_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="on_nonfinite must be 'fail' or 'skip'"):
        _class_trainer(nn.CrossEntropyLoss(), on_nonfinite="ignore")


# --------------------------------------------------------------------- empty windows
def _all_ignored_second_window() -> TensorDataset:
    """8 token sequences, m=2, N=2: window 2 (samples 4..7) has no items at all."""
    tokens, targets = token_dataset(12).tensors
    targets = targets.clone()
    targets[4:8] = -100
    return TensorDataset(tokens, targets)


def _skip_empty_windows_reference(model, dataset, epochs: int):
    """big_batch_training, except that a window without items does not step at all."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    loader = make_loader(dataset, 2, shuffle=False)
    batches = list(loader)
    for _ in range(epochs):
        for start in range(0, len(batches), 2):
            total, count = torch.zeros((), dtype=torch.float64), 0
            for x, y in batches[start : start + 2]:
                s, n = token_loss_sum(model, x, y)
                total, count = total + s, count + n
            if count == 0:
                continue
            (total / count).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model


def test_an_empty_window_steps_neither_optimizer_nor_scheduler() -> None:
    dataset = _all_ignored_second_window()
    model = token_model(torch.float64)
    reference = _skip_empty_windows_reference(model, dataset, epochs=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    recorder = Recorder()
    trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=2, scheduler=scheduler,
                      callbacks=[recorder])
    history = trainer.fit(make_loader(dataset, 2, shuffle=False), epochs=2)
    assert max_abs_diff(model, reference) <= 1e-12
    assert [kind for kind, _, _ in recorder.events] == ["empty_window", "empty_window"]
    assert recorder.events[0][2] == {"step": 2, "epoch": 0}
    assert len(history.steps) == 6 and scheduler.last_epoch == 4  # 6 windows, 2 of them empty
    assert math.isnan(history.steps[1]["loss"]) and history.steps[1]["items_per_s"] == 0


# ------------------------------------------------------- device counts (tensor path)
def _tensor_counts(monkeypatch) -> None:
    """Make every count a tensor, as counts of targets on a GPU are (no sync to read them)."""
    original = items_module.normalise_count

    def as_tensor(count):
        value = original(count)
        return value if isinstance(value, torch.Tensor) else torch.tensor(value)

    monkeypatch.setattr(items_module, "normalise_count", as_tensor)


def test_an_all_ignored_micro_batch_with_a_device_count_adds_nothing(monkeypatch) -> None:
    _tensor_counts(monkeypatch)
    model = token_model(torch.float64)
    tokens, targets = token_dataset(8).tensors
    targets = targets.clone()
    targets[2:4] = -100  # the second micro-batch (m=2) has no items at all
    dataset = TensorDataset(tokens, targets)
    reference, losses = big_batch_training(model, make_loader(dataset, 2, shuffle=False), token_loss_sum,
                                           AccumulationSchedule(4), 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                      loss_fn=TokenCrossEntropy(), accumulation_steps=4)
    history = trainer.fit(make_loader(dataset, 2, shuffle=False), epochs=1, val_loader=make_loader(dataset, 2, shuffle=False))
    assert max_abs_diff(model, reference) <= 1e-12
    assert abs(history.steps[0]["loss"] - losses[0]) <= 1e-12
    # evaluate: the all-ignored batch is skipped, not a NaN in the sum.
    with torch.no_grad():
        total = sum(token_loss_sum(model, x, y)[0] for x, y in make_loader(dataset, 2, shuffle=False))
    assert abs(history.evals[0]["val_loss"] - float(total) / int((targets != -100).sum())) <= 1e-12


def test_an_empty_window_with_device_counts_does_not_step(monkeypatch) -> None:
    _tensor_counts(monkeypatch)
    dataset = _all_ignored_second_window()
    model = token_model(torch.float64)
    reference = _skip_empty_windows_reference(model, dataset, epochs=1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                      loss_fn=TokenCrossEntropy(), accumulation_steps=2)
    trainer.fit(make_loader(dataset, 2, shuffle=False), epochs=1)
    assert max_abs_diff(model, reference) <= 1e-12


def test_class_targets_are_unaffected_by_the_guards() -> None:
    """The control: a run with items in every micro-batch equals the big batch as before."""
    model = class_model(torch.float64)
    dataset = class_dataset(10, torch.float64)
    reference, _ = big_batch_training(model, make_loader(dataset, 3, seed=5), class_loss_sum, AccumulationSchedule(2), 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                      loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2)
    trainer.fit(make_loader(dataset, 3, seed=5), epochs=2)
    assert max_abs_diff(model, reference) <= 1e-12

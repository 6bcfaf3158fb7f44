"""Misuse gets a clear error (or works exactly), never a silent wrong run.

- ``model=None`` / ``optimizer=None``: a TypeError saying what to pass (not an AttributeError
  from deep inside).
- An optimizer built on another model's parameters would train nothing: refused.
- Parameter groups added to the optimizer after ``Trainer()`` are clipped and counted in
  ``grad_norm`` like the others (the stepper reads the groups at every step).
- ``ReduceLROnPlateau`` steps on the validation loss after each scheduled evaluation (not on
  optimizer steps); without a validation loader it is refused at ``fit``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from trainer_reference import class_dataset, class_model, full_batch_gradients, max_abs_diff

from accumcore import Trainer
from accumcore.data import make_loader


def test_missing_model_or_optimizer_is_a_clear_type_error() -> None:
    model = class_model(torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module.*got None"):
        Trainer(None, optimizer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"optimizer must be a torch.optim.Optimizer.*model.parameters\(\)"):
        Trainer(model, None)  # type: ignore[arg-type]


def test_an_optimizer_on_another_models_parameters_is_refused() -> None:
    model = class_model(torch.float32)
    other = copy.deepcopy(model)
    with pytest.raises(ValueError, match="none of the optimizer's parameters belong to the model"):
        Trainer(model, torch.optim.SGD(other.parameters(), lr=0.1))


def test_an_optimizer_on_part_of_the_model_is_accepted() -> None:
    model = class_model(torch.float32)
    Trainer(model, torch.optim.SGD(model[2].parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss())


def test_param_groups_added_after_the_trainer_are_clipped_and_counted() -> None:
    dataset = class_dataset(8, torch.float64)
    model = class_model(torch.float64)
    reference = copy.deepcopy(model)
    grads, norm = full_batch_gradients(model, dataset)
    max_norm = norm / 4
    # The optimizer starts with the first layer only; the head is added after Trainer().
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    trainer = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=4, grad_clip_norm=max_norm)
    optimizer.add_param_group({"params": model[2].parameters()})
    history = trainer.fit(make_loader(dataset, 2, shuffle=False), epochs=1)
    assert history.steps[0]["grad_norm"] == pytest.approx(norm, rel=1e-12)
    for p, q, g in zip(model.parameters(), reference.parameters(), grads, strict=True):
        expected = q.detach() - 0.1 * g * (max_norm / (norm + 1e-6))
        assert torch.allclose(p, expected, rtol=0, atol=1e-12)


def _plateau_run(patience: int, val: bool):
    model = class_model(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=patience)
    trainer = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, scheduler=scheduler)
    data = class_dataset(8, torch.float64)
    loader = make_loader(data, 2, seed=1)
    return trainer, scheduler, trainer.fit(loader, epochs=3, val_loader=make_loader(data, 4) if val else None)


def test_reduce_lr_on_plateau_steps_on_the_validation_loss() -> None:
    trainer, scheduler, history = _plateau_run(patience=0, val=True)
    # One scheduler step per evaluation (3 epochs), with the evaluation's val_loss.
    assert scheduler.last_epoch == 3
    losses = [e["val_loss"] for e in history.evals]
    expected_lr, best = 0.1, float("inf")
    lrs = []
    for loss in losses:
        lrs.append(expected_lr)
        if loss < best * (1 - 1e-4):
            best = loss
        else:
            expected_lr *= 0.5
    # The lr of each epoch's steps is the one set after the previous epoch's evaluation.
    per_epoch = [history.steps[2 * e]["lr"] for e in range(3)]
    assert per_epoch == lrs


def test_reduce_lr_on_plateau_without_validation_is_refused() -> None:
    with pytest.raises(ValueError, match="ReduceLROnPlateau steps on the validation loss: pass val_loader"):
        _plateau_run(patience=0, val=False)


def test_reduce_lr_on_plateau_resumes_exactly() -> None:
    full_trainer, _, _ = _plateau_run(patience=0, val=True)
    model = class_model(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
    first = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, scheduler=scheduler)
    data = class_dataset(8, torch.float64)
    first.fit(make_loader(data, 2, seed=1), epochs=3, val_loader=make_loader(data, 4), max_steps=3)
    model2 = class_model(torch.float64)
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.1)
    resumed = Trainer(model2, optimizer2, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2,
                      scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer2, factor=0.5, patience=0))
    resumed.load_state_dict(first.state_dict())
    resumed.fit(make_loader(data, 2, seed=1), epochs=3, val_loader=make_loader(data, 4))
    assert max_abs_diff(model2, full_trainer.model) == 0.0

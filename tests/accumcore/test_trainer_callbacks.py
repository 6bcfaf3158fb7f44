"""Callbacks see every step's metrics, evals, events and checkpoints; should_stop acts within
one micro-batch; bad settings are refused with a message that says how to fix them."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn
from trainer_reference import TokenCrossEntropy, class_dataset, class_model

from accumcore import Callback, CheckpointInfo, Trainer
from accumcore.data import make_loader

STEP_KEYS = {"step", "epoch", "loss", "lr", "grad_norm", "samples_per_s", "items_per_s", "step_time_s"}


class Recorder(Callback):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.steps: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []
        self.events: list[tuple[str, str, dict]] = []
        self.checkpoints: list[CheckpointInfo] = []

    def on_fit_start(self, trainer) -> None:
        self.calls.append("fit_start")

    def on_step(self, trainer, metrics) -> None:
        self.calls.append("step")
        self.steps.append(metrics)

    def on_eval(self, trainer, metrics) -> None:
        self.calls.append("eval")
        self.evals.append(metrics)

    def on_checkpoint(self, trainer, info) -> None:
        self.calls.append("checkpoint")
        self.checkpoints.append(info)

    def on_event(self, trainer, kind, message, data) -> None:
        self.events.append((kind, message, data))

    def on_fit_end(self, trainer, history) -> None:
        self.calls.append("fit_end")


def _trainer(callbacks, **kwargs) -> Trainer:
    model = class_model(torch.float32)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                   callbacks=callbacks, **kwargs)


@pytest.mark.parametrize("grad_clip_norm", [None, 0.05])
def test_grad_norm_off_skips_the_metric_and_changes_no_parameter(grad_clip_norm) -> None:
    """Trainer(grad_norm=False) saves the per-step pass over the gradients; training is the
    same, and with clipping the norm is computed anyway (clipping needs it) and reported."""
    data = class_dataset(10, torch.float32)
    runs = {}
    for grad_norm in (True, False):
        torch.manual_seed(0)
        recorder = Recorder()
        trainer = _trainer([recorder], accumulation_steps=2, grad_norm=grad_norm,
                           grad_clip_norm=grad_clip_norm)
        trainer.fit(make_loader(data, 3, seed=1), epochs=2)
        runs[grad_norm] = (recorder.steps, [p.detach().clone() for p in trainer.model.parameters()])
    (with_steps, with_params), (without_steps, without_params) = runs[True], runs[False]
    assert all(torch.equal(a, b) for a, b in zip(with_params, without_params, strict=True))
    assert all("grad_norm" in m for m in with_steps)
    if grad_clip_norm is None:
        assert not any("grad_norm" in m for m in without_steps)
    else:
        assert [m["grad_norm"] for m in without_steps] == [m["grad_norm"] for m in with_steps]


def test_callbacks_receive_metrics_evals_and_checkpoints(tmp_path) -> None:
    recorder = Recorder()
    trainer = _trainer([recorder], accumulation_steps=2, checkpoint_every=2, checkpoint_dir=tmp_path)
    data = class_dataset(10, torch.float32)
    trainer.fit(make_loader(data, 3), epochs=2, val_loader=make_loader(data, 4, shuffle=False))
    assert recorder.calls == [
        "fit_start", "step", "step", "checkpoint", "eval", "step", "step", "checkpoint", "eval", "fit_end",
    ]
    for step, metrics in enumerate(recorder.steps, start=1):
        assert set(metrics) == STEP_KEYS and metrics["step"] == step
        assert all(isinstance(v, float) for v in metrics.values())
        assert metrics["grad_norm"] > 0 and metrics["samples_per_s"] > 0
    assert [e["epoch"] for e in recorder.evals] == [0.0, 1.0]
    assert 0.0 <= recorder.evals[0]["val_accuracy"] <= 1.0 and recorder.evals[0]["val_loss"] > 0
    for info in recorder.checkpoints:
        data_bytes = info.path.read_bytes()
        assert info.path.name == f"{info.step}.pt" and info.size_bytes == len(data_bytes)
        assert info.sha256 == hashlib.sha256(data_bytes).hexdigest()
        assert info.metrics["step"] == info.step
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


class StopAt(Callback):
    """Says stop from the k-th poll on; counts the forwards run after that."""

    def __init__(self, model: nn.Module, k: int) -> None:
        self.polls = 0
        self.k = k
        self.forwards_after_stop = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *args) -> None:
        if self.polls >= self.k:
            self.forwards_after_stop += 1

    def should_stop(self) -> bool:
        self.polls += 1
        return self.polls >= self.k


def test_should_stop_takes_effect_before_the_next_micro_batch(tmp_path) -> None:
    model = class_model(torch.float32)
    before = [p.detach().clone() for p in model.parameters()]
    stopper = StopAt(model, k=3)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=4, callbacks=[stopper], checkpoint_dir=tmp_path)
    history = trainer.fit(make_loader(class_dataset(16, torch.float32), 2), epochs=1)
    assert history.stopped and stopper.polls == 3 and stopper.forwards_after_stop == 0
    # The stopped window is discarded: no step, no gradients left, no checkpoint written.
    assert trainer.global_step == 0 and not history.steps and not list(tmp_path.iterdir())
    assert all(torch.equal(a, p) and p.grad is None for a, p in zip(before, model.parameters(), strict=True))


def test_only_callbacks_that_override_should_stop_make_the_trainer_poll() -> None:
    model = class_model(torch.float32)
    quiet = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                    callbacks=[Recorder()])
    polled = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                     callbacks=[Recorder(), StopAt(model, k=3)])
    assert not quiet.callbacks.can_stop and polled.callbacks.can_stop


def test_batchnorm_in_train_mode_is_reported_as_an_event() -> None:
    recorder = Recorder()
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2, callbacks=[recorder])
    trainer.fit(make_loader(class_dataset(8, torch.float32), 4), epochs=1)
    assert [kind for kind, _, _ in recorder.events] == ["batchnorm_warning"]
    assert "not exactly equivalent" in recorder.events[0][1]


def test_batchnorm_frozen_in_eval_mode_stays_frozen_and_is_not_reported() -> None:
    recorder = Recorder()
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    model[1].eval()
    stats = model[1].running_mean.clone()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2, callbacks=[recorder])
    data = class_dataset(8, torch.float32)
    trainer.fit(make_loader(data, 4), epochs=2, val_loader=make_loader(data, 4))
    assert recorder.events == [] and len(recorder.evals) == 2
    assert model.training and not model[1].training  # evaluation restored each module's mode
    assert torch.equal(model[1].running_mean, stats)


def test_max_steps_stops_and_checkpoints(tmp_path) -> None:
    trainer = _trainer([], accumulation_steps=1, checkpoint_dir=tmp_path)
    history = trainer.fit(make_loader(class_dataset(10, torch.float32), 2), epochs=5, max_steps=3)
    assert trainer.global_step == 3 and len(history.steps) == 3 and not history.stopped
    assert [p.name for p in tmp_path.glob("*.pt")] == ["3.pt"]


def test_eval_every_evaluates_on_optimizer_steps() -> None:
    recorder = Recorder()
    trainer = _trainer([recorder], accumulation_steps=2)
    data = class_dataset(12, torch.float32)
    trainer.fit(make_loader(data, 2), epochs=1, val_loader=make_loader(data, 4), eval_every=1)
    # Steps 1, 2, 3, and the end-of-epoch eval (after step 3).
    assert [e["step"] for e in recorder.evals] == [1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_loss_without_mean_reduction_is_refused(reduction: str) -> None:
    model = class_model(torch.float32)
    with pytest.raises(ValueError, match="pass reduction='mean'"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(reduction=reduction))
    with pytest.raises(ValueError, match="pass reduction='mean'"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=TokenCrossEntropy(reduction))


def test_non_scalar_loss_is_refused_at_the_first_micro_batch() -> None:
    model = class_model(torch.float32)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                      loss_fn=lambda out, y: nn.functional.cross_entropy(out, y, reduction="none"))
    with pytest.raises(ValueError, match="reduction='mean'"):
        trainer.fit(make_loader(class_dataset(4, torch.float32), 2), epochs=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"accumulation_steps": 0}, r"accumulation_steps\[0\] must be an int >= 1"),
        ({"accumulation_steps": {0: 2, -1: 3}}, "keys are epochs"),
        ({"accumulation_steps": 2.5}, "must be an int >= 1 or a dict"),
        ({"precision": "fp8"}, "precision must be one of fp32, bf16, fp16"),
        ({"checkpoint_every": 5}, "checkpoint_every needs checkpoint_dir"),
        ({"loss_fn": nn.CrossEntropyLoss(ignore_index=0)}, r"pass Trainer\(ignore_index=0\)"),
        ({"loss_fn": nn.CrossEntropyLoss(weight=torch.ones(3))}, "count_items"),
        ({"callbacks": [object()]}, "must subclass accumcore.Callback"),
    ],
)
def test_bad_settings_are_refused_with_the_fix(kwargs: dict, message: str) -> None:
    model = class_model(torch.float32)
    kwargs.setdefault("loss_fn", nn.CrossEntropyLoss())
    with pytest.raises((ValueError, TypeError), match=message):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)

"""``compile: true``: the model's forward (and, through AOTAutograd, its backward) compiled by
torch.compile, the window's arithmetic still the trainer's. In float64 a compiled run still
equals the big batch to 1e-12 (the short last window, whose micro-batch of 1 recompiles with
dynamic shapes); ``CompileWatch`` reports the seconds spent compiling after the first step;
a toolchain that breaks at compile time falls back to eager with the reason as an event, and
the run stays exact. Compiling takes 10-60 s per graph on this 2-core machine."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_reference import (
    big_batch_training,
    class_dataset,
    class_loss_sum,
    class_model,
    max_abs_diff,
)

from accumcore import Trainer, fast_path
from accumcore.compile_watch import CompileWatch
from accumcore.data import make_loader
from accumcore.schedule import AccumulationSchedule

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(fast_path.compile_available() is not None, reason="no inductor toolchain"),
]

SAMPLES, MICRO, STEPS, EPOCHS = 10, 3, 2, 2  # micro-batches 3, 3, 3, 1: windows of 6 and 4


def compiled_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with its forward compiled (lazily: at the first call)."""
    torch._dynamo.reset()
    trained = copy.deepcopy(model)
    assert fast_path.maybe_compile(trained, True).compiled
    return trained


def fit(trained: torch.nn.Module, dataset) -> list[dict]:  # noqa: ANN001
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1, momentum=0.5)
    trainer = Trainer(trained, optimizer, loss_fn=torch.nn.CrossEntropyLoss(), accumulation_steps=STEPS,
                      callbacks=[CompileWatch()])
    return trainer.fit(make_loader(dataset, MICRO, seed=5), epochs=EPOCHS).events


def test_a_compiled_model_trains_the_big_batch_update_and_reports_its_compile_time() -> None:
    model, dataset = class_model(torch.float64), class_dataset(SAMPLES, torch.float64)
    reference, _ = big_batch_training(model, make_loader(dataset, MICRO, seed=5), class_loss_sum,
                                      AccumulationSchedule(STEPS), EPOCHS)
    trained = compiled_copy(model)
    events = fit(trained, dataset)
    assert max_abs_diff(trained, reference) <= 1e-12
    assert max_abs_diff(model, reference) > 1e-3  # it trained
    [compiled] = [e for e in events if e["kind"].startswith("compile")]
    assert compiled["kind"] == "compiled", compiled
    assert compiled["data"]["compile_s"] > 0 and compiled["data"]["graphs"] >= 1


def test_a_compile_that_fails_runs_eagerly_exactly_and_says_why() -> None:
    # Another shape and dtype than the test above, and no caches: nothing compiled before
    # can stand in for the compiler that now fails.
    model, dataset = class_model(torch.float32, seed=3), class_dataset(SAMPLES, torch.float32, seed=4)
    reference, _ = big_batch_training(model, make_loader(dataset, MICRO, seed=5), class_loss_sum,
                                      AccumulationSchedule(STEPS), EPOCHS)
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    trained = compiled_copy(model)  # the toolchain works now; it breaks before the first call
    with inductor_config.patch({"cpp.cxx": ("/bin/false",), "fx_graph_cache": False}), \
            functorch_config.patch({"enable_autograd_cache": False}):
        events = fit(trained, dataset)
    assert max_abs_diff(trained, reference) <= 1e-5
    [fallback] = [e for e in events if e["kind"].startswith("compile")]
    assert fallback["kind"] == "compile_fallback", fallback
    assert "C++ compiler" in fallback["data"]["reason"] and fallback["data"]["compiled_frames"] == 0

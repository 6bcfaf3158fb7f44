"""What counts as out of memory, in one place (``accumcore.oom.is_oom``), and where it is
caught: CUDA libraries' allocation failures arrive as plain RuntimeErrors (cuBLAS, cuDNN,
NCCL), the optimizer's first step allocates its state (Adam) and may run out there, and
``release_memory`` empties the CUDA cache after a caught OOM. Exceptions are injected on the
CPU with the messages those libraries raise; each back-off still ends at the big batch's
update (float64 oracle)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from trainer_reference import (
    big_batch_training,
    class_dataset,
    class_loss_sum,
    class_model,
    max_abs_diff,
)

from accumcore import Callback, Trainer, oom
from accumcore.auto_batch import find_micro_batch_size
from accumcore.data import make_loader
from accumcore.oom import MicroBatchTooSmall, OptimizerStepOutOfMemory, is_oom
from accumcore.schedule import AccumulationSchedule

LIBRARY_OOMS = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1270, unhandled cuda error, NCCL version 2.21.5\n"
                 "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'"),
]
NOT_OOMS = [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x5 and 4x6)"),
    RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
    ValueError("out of memory"),  # not an error torch raises for memory
    MicroBatchTooSmall("out of memory with a micro-batch of 1 sample"),  # the end of the back-off
]


@pytest.mark.parametrize("exc", LIBRARY_OOMS, ids=lambda e: str(e)[:30])
def test_library_allocation_failures_are_out_of_memory(exc: BaseException) -> None:
    assert is_oom(exc)


@pytest.mark.parametrize("exc", NOT_OOMS, ids=lambda e: str(e)[:30])
def test_other_errors_are_not(exc: BaseException) -> None:
    assert not is_oom(exc)


class RaisesOnce(nn.Module):
    """Raises ``error`` for batches of more than ``limit`` samples (a library's OOM)."""

    def __init__(self, inner: nn.Module, error: BaseException, limit: int) -> None:
        super().__init__()
        self.inner, self.error, self.limit = inner, error, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise type(self.error)(*self.error.args)
        return self.inner(x)


class Events(Callback):
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def on_event(self, trainer, kind, message, data) -> None:
        self.kinds.append(kind)


def _reference(base: nn.Module, dataset, m: int = 4, n: int = 2) -> nn.Module:
    return big_batch_training(base, make_loader(dataset, m, seed=3), class_loss_sum,
                              AccumulationSchedule(n), epochs=2)[0]


@pytest.mark.parametrize("exc", LIBRARY_OOMS[1:], ids=lambda e: str(e)[:30])
def test_a_library_oom_in_the_forward_backs_off_and_stays_exact(exc: BaseException) -> None:
    base = class_model(torch.float64)
    dataset = class_dataset(12, torch.float64)
    reference = _reference(base, dataset)
    model = RaisesOnce(copy.deepcopy(base), exc, limit=2)
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                      loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, callbacks=[events])
    trainer.fit(make_loader(dataset, 4, seed=3), epochs=2)
    assert events.kinds == ["oom_backoff"] and trainer.oom_split == 2
    assert max_abs_diff(model.inner, reference) <= 1e-12


def test_a_shape_error_is_not_backed_off() -> None:
    model = RaisesOnce(class_model(torch.float32), NOT_OOMS[0], limit=2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss())
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        trainer.fit(make_loader(class_dataset(8, torch.float32), 4), epochs=1)
    assert trainer.oom_split == 1


class AdamOutOfMemoryOnce(torch.optim.Adam):
    """Adam whose first step runs out of memory half-way through allocating its state (after
    the first parameter's), as a first Adam step on a nearly full GPU does."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.failures = 1

    def step(self, closure=None):  # type: ignore[override]
        if self.failures:
            self.failures -= 1
            first = self.param_groups[0]["params"][0]
            self.state[first]["step"] = torch.tensor(0.0)
            self.state[first]["exp_avg"] = torch.zeros_like(first)
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED (injected)")
        return super().step(closure)


def test_oom_allocating_the_optimizer_state_is_inside_the_back_off() -> None:
    base = class_model(torch.float64)
    dataset = class_dataset(12, torch.float64)
    reference = copy.deepcopy(base)  # the same run with an Adam that never runs out of memory
    Trainer(reference, torch.optim.Adam(reference.parameters(), lr=0.01), loss_fn=nn.CrossEntropyLoss(),
            accumulation_steps=2).fit(make_loader(dataset, 4, seed=3), epochs=2)
    model = copy.deepcopy(base)
    optimizer = AdamOutOfMemoryOnce(model.parameters(), lr=0.01)
    events = Events()
    trainer = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, callbacks=[events])
    history = trainer.fit(make_loader(dataset, 4, seed=3), epochs=2)
    assert events.kinds == ["oom_backoff"] and trainer.oom_split == 2
    assert len(history.steps) == 4  # the failed step was run again, not skipped
    assert max_abs_diff(model, reference) <= 1e-12


def test_oom_in_a_later_optimizer_step_says_it_cannot_be_retried() -> None:
    model = class_model(torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=1)
    loader = make_loader(class_dataset(8, torch.float32), 4)
    trainer.fit(loader, epochs=1)  # the state exists from here on

    def fail(closure=None):
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    optimizer.step = fail  # type: ignore[method-assign]
    with pytest.raises(OptimizerStepOutOfMemory, match="half applied.*smaller micro_batch_size"):
        trainer.fit(loader, epochs=2)


def test_release_memory_empties_the_cuda_cache_after_a_caught_oom(monkeypatch: pytest.MonkeyPatch) -> None:
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    oom.release_memory()
    assert emptied == [True]


def test_the_probe_treats_a_library_oom_as_not_fitting_and_raises_other_errors() -> None:
    def sample(m: int):
        return torch.randn(m, 4), torch.randint(0, 3, (m,))

    fits = RaisesOnce(class_model(torch.float32), LIBRARY_OOMS[2], limit=6)
    assert find_micro_batch_size(fits, sample, 24) == 6
    broken = RaisesOnce(class_model(torch.float32), NOT_OOMS[0], limit=6)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        find_micro_batch_size(broken, sample, 24)

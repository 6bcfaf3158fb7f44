"""Automatic micro-batch size: the largest m that divides the effective batch B and fits.

Rule 11 of docs/accumulation.md: m must divide B so that m x N == B exactly (no floor division
that silently shrinks the effective batch). Memory grows with m, so the divisors of B are
binary-searched, each probe being a real ``Trainer`` window on batches from
``sample_batch_fn(m)``: forwards, backwards (two micro-batches, so the gradient accumulation's
transients show) and an optimizer step (of the trainer's optimizer type, on a probe optimizer
whose state is allocated before the window, as it is in a long run); parameters, buffers,
each module's own mode and every RNG's state are restored afterwards:

    m = find_micro_batch_size(model, lambda m: (torch.randn(m, 3, 32, 32), torch.zeros(m, dtype=torch.long)),
                              effective_batch_size=256, device="cuda", optimizer=optimizer,
                              read_ahead=reads_window_ahead(loader))
    n = accumulation_for(256, m)

A probe's peak is measured the way the memory benchmarks judge "fits": on CUDA
``max_memory_allocated`` after a reset (a real out-of-memory error also means "does not
fit"); on the CPU, where nothing runs out, the live state (parameters, buffers, optimizer
state) plus the profiler's allocator peak of the window (``accumcore.peak_memory``), plus
what the window's further micro-batches hold: their targets, and their inputs too when the
trainer reads the window ahead (see ``accumcore.window_source``). ``memory_limit_bytes`` caps the peak, which lets tests and
capacity planning inject a limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import TensorDataset

from accumcore import distributed, items
from accumcore.callbacks import Callback
from accumcore.data import make_loader
from accumcore.oom import MicroBatchTooSmall, is_oom, release_memory
from accumcore.peak_memory import cpu_peak_added, cuda_fit_peak, tensor_bytes
from accumcore.rng import capture_rng_state, restore_rng_state
from accumcore.trainer import Trainer

OptimizerSpec = torch.optim.Optimizer | type[torch.optim.Optimizer] | None


def divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def accumulation_for(effective_batch_size: int, micro_batch_size: int) -> int:
    """N such that m x N == B, or a clear error when m does not divide B."""
    if micro_batch_size < 1 or effective_batch_size % micro_batch_size:
        raise ValueError(
            f"micro_batch_size {micro_batch_size} does not divide effective_batch_size "
            f"{effective_batch_size}; pick one of {divisors(effective_batch_size)} or 'auto'"
        )
    return effective_batch_size // micro_batch_size


def find_micro_batch_size(
    model: torch.nn.Module,
    sample_batch_fn: Callable[[int], Any],
    effective_batch_size: int,
    device: str | torch.device = "cpu",
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    precision: str = "fp32",
    memory_limit_bytes: int | None = None,
    max_micro_batch_size: int | None = None,
    optimizer: OptimizerSpec = None,
    read_ahead: bool = True,
) -> int:
    """The largest divisor m of ``effective_batch_size`` whose training step fits.

    Args:
        model: the model to probe (parameters, gradients, buffers, each module's mode and the
            RNG states are restored afterwards).
        sample_batch_fn: ``fn(m) -> (inputs, targets)``, a fresh representative batch of m
            samples (as a loader would build it).
        effective_batch_size: B, samples per optimizer step (per rank).
        device: where to probe.
        loss_fn: defaults to cross-entropy.
        precision: as in ``Trainer``; autocast changes the memory a probe needs.
        memory_limit_bytes: treat a probe whose peak is above this as out of memory.
        max_micro_batch_size: never return more than this.
        optimizer: the training optimizer (its type and settings are used on a probe copy of
            the state; its own state is not touched) or an optimizer class; None probes
            with Adam (two state tensors per parameter, more than SGD or RMSprop keep).
        read_ahead: whether the trainer will load a window's N micro-batches ahead
            (``accumcore.window_source.reads_window_ahead(loader)``); on the CPU their
            bytes count. On CUDA read-ahead batches stay on the host.

    Raises:
        RuntimeError: when even m=1 does not fit.
    """
    if effective_batch_size < 1:
        raise ValueError(f"effective_batch_size must be >= 1, got {effective_batch_size}")
    device = torch.device(device)
    loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
    # Probe the bare module: DDP would all-reduce every probe's gradients, and ranks probing
    # different sizes would wait on each other forever.
    model = distributed.unwrap(model)
    candidates = [
        d for d in divisors(effective_batch_size)
        if max_micro_batch_size is None or d <= max_micro_batch_size
    ]
    # Probe as the trainer trains: a model left in eval mode as a whole is switched to train
    # mode, submodules the user froze (a BatchNorm in eval mode) stay as they are. Afterwards
    # every module gets its own mode back, and every RNG its state (the probes draw batches
    # and dropout masks).
    modes = [(m, m.training) for m in model.modules()]
    rng = capture_rng_state()
    if not model.training:
        model.train()
    best = None
    low, high = 0, len(candidates) - 1
    try:
        while low <= high:
            middle = (low + high) // 2
            size = candidates[middle]
            used = measure_footprint(
                model, sample_batch_fn, size, device, loss_fn=loss_fn, precision=precision,
                optimizer=optimizer, accumulation_steps=effective_batch_size // size, read_ahead=read_ahead,
            )
            if used is not None and (memory_limit_bytes is None or used <= memory_limit_bytes):
                best = size
                low = middle + 1
            else:
                high = middle - 1
    finally:
        _restore(modes, rng)
    if best is None:
        raise RuntimeError(
            "not even a micro-batch of 1 sample fits on "
            f"{device}{f' within {memory_limit_bytes} bytes' if memory_limit_bytes else ''}; "
            "use precision='bf16' or 'fp16', a smaller model, or a larger device"
        )
    return best


def measure_footprint(
    model: torch.nn.Module,
    sample_batch_fn: Callable[[int], Any],
    size: int,
    device: str | torch.device = "cpu",
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    precision: str = "fp32",
    optimizer: OptimizerSpec = None,
    accumulation_steps: int = 1,
    read_ahead: bool = False,
) -> int | None:
    """Peak bytes of a training window of ``accumulation_steps`` micro-batches of ``size``
    samples; None when it ran out of memory.

    Measured on a real ``Trainer`` window of min(N, 2) micro-batches (the second one shows the
    gradient accumulation's transients), with the optimizer state already allocated (see
    ``find_micro_batch_size`` for ``optimizer``). What the N - 2 further micro-batches of a
    window add is counted from their sizes: their targets (read ahead to count W), and with
    ``read_ahead`` their inputs too. CUDA: max allocated memory; CPU: parameters, buffers
    and optimizer state, plus the allocator peak of the window. Parameters, gradients and
    buffers (BatchNorm statistics), each module's mode and the RNG states are restored afterwards.
    """
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    device = torch.device(device)
    loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
    model = distributed.unwrap(model)
    modes = [(m, m.training) for m in model.modules()]
    rng = capture_rng_state()  # before the probe loader samples its first batch
    params = [p for p in model.parameters() if p.requires_grad]
    # Kept on the host: on CUDA a copy on the device would count against the probe.
    saved_params = [p.detach().to("cpu", copy=True) for p in params]
    saved_buffers = [(b, b.detach().to("cpu", copy=True)) for b in model.buffers()]
    probe_optimizer: torch.optim.Optimizer | None = None
    probed = min(accumulation_steps, 2)
    loader = _ProbeLoader(sample_batch_fn, size, probed, lazy=not read_ahead)

    def window() -> list[dict[str, Any]]:
        # A real Trainer window: the trainer's own allocations count too.
        assert probe_optimizer is not None
        trainer = Trainer(model, probe_optimizer, loss_fn=loss_fn, accumulation_steps=probed,
                          precision=precision, device=device, callbacks=[_NoBackOff()])
        # Ends with zero_grad: freed inside the measurement.
        return trainer.fit(loader.loader, epochs=1).steps

    used: int | None = None
    try:
        probe_optimizer = _probe_optimizer(optimizer, params)
        _allocate_state(probe_optimizer, params)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            steps = window()
            torch.cuda.synchronize(device)
            used = cuda_fit_peak(steps, device)
        else:
            alive = tensor_bytes(list(model.parameters()) + list(model.buffers()))
            alive += tensor_bytes(list(probe_optimizer.state.values()))
            peak = cpu_peak_added(window)  # first: it records the sizes of the loaded batches
            per_micro_batch = loader.targets_bytes + _BOOKKEEPING_BYTES
            if read_ahead:
                per_micro_batch += loader.inputs_bytes
            used = alive + peak + (accumulation_steps - probed) * per_micro_batch
    except (RuntimeError, _ProbeOutOfMemory) as exc:
        if not (is_oom(exc) or isinstance(exc, _ProbeOutOfMemory | MicroBatchTooSmall)):
            raise
        used = None  # does not fit (the cache is emptied below, after the finally)
    finally:
        model.zero_grad(set_to_none=True)
        probe_optimizer = None
        with torch.no_grad():
            for param, saved in zip(params, saved_params, strict=True):
                param.copy_(saved)  # the probe's optimizer steps must not train the model
            for buffer, saved in saved_buffers:
                buffer.copy_(saved)  # nor move BatchNorm statistics
        _restore(modes, rng)  # nor change what training draws next
    if used is None:
        release_memory()
    return used


def _restore(modes: list[tuple[torch.nn.Module, bool]], rng: dict[str, Any]) -> None:
    for module, training in modes:
        module.training = training
    restore_rng_state(rng)


class _ProbeOutOfMemory(Exception):
    """The probe ran out of memory (the trainer would have backed off to a smaller m)."""


class _NoBackOff(Callback):
    """In a probe, running out of memory means "does not fit", not "split and go on"."""

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        if kind == "oom_backoff":
            raise _ProbeOutOfMemory(message)


# What a window keeps per micro-batch besides its targets (a detached loss, a count), rounded up.
_BOOKKEEPING_BYTES = 64


class _ProbeLoader:
    """The probe window's batches, loaded inside the measurement as a training loader would.

    ``lazy``: ``make_loader`` over one sampled (inputs, targets) batch, so the trainer counts W
    from the targets and loads each micro-batch just in time, as it does for such loaders;
    otherwise (or when the batch is not two tensors) fresh batches from ``sample_batch_fn``,
    which the trainer reads ahead.
    """

    def __init__(self, sample_batch_fn: Callable[[int], Any], size: int, count: int, lazy: bool) -> None:
        self.sample_batch_fn = sample_batch_fn
        self.size = size
        self.count = count
        self.inputs_bytes = 0
        self.targets_bytes = 0
        self.loader: Any = self
        if lazy:
            inputs, targets = items.unpack(sample_batch_fn(size))
            self._record(inputs, targets)
            if isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor):
                # The batch `count` times, through make_loader as the service's jobs load: its
                # order is a function of (seed, epoch), so the trainer saves no RNG states for it.
                dataset = TensorDataset(torch.cat([inputs.cpu()] * count), torch.cat([targets.cpu()] * count))
                self.loader = make_loader(dataset, size, shuffle=False)

    def _record(self, inputs: Any, targets: Any) -> None:
        self.inputs_bytes, self.targets_bytes = tensor_bytes(inputs), tensor_bytes(targets)

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.count):
            batch = self.sample_batch_fn(self.size)
            self._record(*items.unpack(batch))
            yield batch


def _probe_optimizer(optimizer: OptimizerSpec, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """A fresh optimizer of the training optimizer's type and settings, on ``params``."""
    if isinstance(optimizer, torch.optim.Optimizer):
        kind: Any = type(optimizer)
        try:
            return kind(params, **optimizer.defaults)
        except (TypeError, ValueError):  # defaults that are not constructor arguments
            return kind(params, lr=optimizer.defaults.get("lr", 1e-3))
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        optimizer_class: Any = optimizer  # its subclasses take their own defaults
        return optimizer_class(params)
    if optimizer is not None:
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, an Optimizer class or None, got {type(optimizer).__name__}"
        )
    return torch.optim.Adam(params)


def _allocate_state(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    """Create the optimizer state, as after the first step of a run (zero gradients)."""
    for param in params:
        param.grad = torch.zeros_like(param)
    optimizer.step()
    for param in params:
        param.grad = None

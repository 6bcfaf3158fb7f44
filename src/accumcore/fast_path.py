"""The fast path: speed-ups that do not change the arithmetic of a training step.

Each function is a no-op, or safe, on CPU, so callers apply them unconditionally:

    from accumcore import Trainer, fast_path
    from accumcore.device_data import fast_loader
    model, optimizer = fast_path.prepare(model, {"name": "adamw", "lr": 1e-3}, "cuda", compile=False)
    loader = fast_loader(dataset, 64, seed=0, device="cuda", name="cifar10", num_workers=4)
    Trainer(model, optimizer, accumulation_steps=4, precision="bf16", device="cuda").fit(loader)

`fast_loader` holds the small datasets on the device (`DeviceBatches`) and streams the rest
with pinned memory, persistent workers and `CudaPrefetcher`; both keep `make_loader`'s order.

What it does, and why each one keeps the math:
- `channels_last` memory format for models with 2-D convolutions on CUDA: same values, a
  faster cuDNN layout (tensor cores want NHWC).
- fused (CUDA) or foreach (CPU) optimizer kernels: the same update formula, applied to all
  parameters in a few kernels instead of one small kernel per parameter. The fused CPU/CUDA
  kernels may round differently in the last bit; `make_optimizer(..., exact=True)` (the
  default on CPU) therefore only takes the foreach variant there, which is bitwise equal
  to the per-parameter loop (tests/accumcore/test_fast_path.py checks both).
- pinned host memory, non-blocking copies and persistent DataLoader workers: only where the
  bytes travel and who produces them changes.
- `CudaPrefetcher`: copies the next micro-batch to the GPU on a side stream while the current
  one computes; the compute stream waits on the copy before use.
- `maybe_compile`: optional `torch.compile` (the job asked for `compile: true`); it may reorder
  floating-point operations, so it is never on by default. It compiles the model's forward
  only, so the trainer's accumulation logic (item weighting, no_sync, step at the boundary)
  stays plain Python and keeps working unchanged.
- bf16 autocast is the trainer's `precision="bf16"`; it is the one change of arithmetic, and
  only when the user asked for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from accumcore import items
from accumcore.device_feed import record_stream

log = logging.getLogger(__name__)

OPTIMIZERS = ("sgd", "adam", "adamw")


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(module, nn.Conv2d) for module in model.modules())


def use_channels_last(
    model: nn.Module, device: str | torch.device, *, on_cpu: bool = False
) -> nn.Module:
    """Convert a convolutional model to channels_last on CUDA; return it unchanged otherwise.

    On CPU it is opt-in (`on_cpu=True`): oneDNN's channels_last convolutions were 1.18-1.29x
    faster on bench's small_cnn, but they sum in another order, and fp32 gradients then differ
    from the NCHW ones by up to ~1e-5 relative, so a CPU run would no longer match a plain run
    to the bit. Inputs need not be converted: a convolution with channels_last weights picks
    the layout up. The model is modified in place and returned.
    """
    if (is_cuda(device) or on_cpu) and has_conv2d(model):
        model = model.to(memory_format=torch.channels_last)
    return model


def _kernel_flags(name: str, device: str | torch.device, exact: bool) -> dict[str, bool]:
    """fused=True on CUDA; foreach=True on CPU (or fused there when exact=False)."""
    if is_cuda(device):
        return {"fused": True}
    if not exact and name in OPTIMIZERS:
        return {"fused": True}
    return {"foreach": True}


def make_optimizer(
    name: str,
    params: Iterable[Any],
    lr: float,
    *,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    device: str | torch.device = "cpu",
    fast: bool = True,
    exact: bool | None = None,
) -> torch.optim.Optimizer:
    """Build `sgd`, `adam` or `adamw` with the fastest kernel torch has for `device`.

    Args:
        name: "sgd" | "adam" | "adamw".
        params: parameters or parameter groups, as for any torch optimizer.
        lr, momentum (sgd), weight_decay, betas and eps (adam/adamw): the usual meanings.
        device: where the parameters live; picks fused (CUDA) or foreach (CPU) kernels.
        fast: False builds the plain per-parameter optimizer (the reference).
        exact: True keeps only kernels bitwise equal to the plain ones (foreach); None means
            True on CPU, where the tests check bitwise equality, and False on CUDA.

    Raises:
        ValueError: an unknown name or a non-positive learning rate, with the allowed values.
    """
    key = name.lower()
    if key not in OPTIMIZERS:
        raise ValueError(f"optimizer name {name!r} is not one of {', '.join(OPTIMIZERS)}")
    if not lr > 0:
        raise ValueError(f"optimizer lr must be > 0, got {lr!r}")
    if exact is None:
        exact = not is_cuda(device)
    flags = _kernel_flags(key, device, exact) if fast else {"foreach": False}
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **flags)
    cls = torch.optim.Adam if key == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **flags)


def loader_kwargs(device: str | torch.device, num_workers: int = 0) -> dict[str, Any]:
    """DataLoader keyword arguments for feeding `device` fast.

    pin_memory only for CUDA (page-locked buffers make the copy asynchronous); persistent
    workers and a prefetch factor only when there are workers (torch refuses them otherwise).
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    kwargs: dict[str, Any] = {"num_workers": num_workers, "pin_memory": is_cuda(device)}
    if num_workers > 0:
        kwargs["persistent_workers"] = True
        kwargs["prefetch_factor"] = 4
    return kwargs


class CudaPrefetcher:
    """Iterate a loader, copying batch k+1 to the GPU on a side stream while batch k computes.

    On CPU (or when `device` is not CUDA) it yields the loader's batches unchanged. Anything
    else the trainer asks of the loader (len, sampler, set_epoch, state_dict, ...) is
    forwarded, so it can stand where the loader stood. Pair it with pinned memory
    (`loader_kwargs`) or the copy is not asynchronous.
    """

    def __init__(self, loader: Iterable[Any], device: str | torch.device) -> None:
        self.loader = loader
        self.device = torch.device(device)
        self.enabled = self.device.type == "cuda" and torch.cuda.is_available()

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this object lacks: forward them to the wrapped loader.
        return getattr(self.__dict__["loader"], name)

    def __iter__(self) -> Iterator[Any]:
        if not self.enabled:
            yield from self.loader
            return
        stream = torch.cuda.Stream(device=self.device)
        iterator = iter(self.loader)

        def load_next() -> Any:
            try:
                batch = next(iterator)
            except StopIteration:
                return _END
            with torch.cuda.stream(stream):
                return items.to_device(batch, self.device)  # non-blocking

        upcoming = load_next()
        while upcoming is not _END:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            current = upcoming
            record_stream(current, torch.cuda.current_stream(self.device))
            upcoming = load_next()
            yield current


_END = object()


@dataclass(frozen=True)
class CompileResult:
    model: nn.Module
    compiled: bool
    reason: str  # why it was not compiled, or "compiled"


def compile_available() -> str | None:
    """None when torch.compile can run here, else the reason (e.g. no C++ compiler)."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        from torch._inductor import cpp_builder

        compiler = cpp_builder.get_cpp_compiler()
        if not compiler:
            return "no C++ compiler for the inductor backend"
    except Exception as error:  # noqa: BLE001 - any failure means "cannot compile here"
        return f"inductor toolchain unavailable: {error}"
    return None


def maybe_compile(model: nn.Module, enabled: bool, *, mode: str | None = None) -> CompileResult:
    """Compile the model's forward with torch.compile when asked and possible.

    Only the forward is compiled (as `model.compile()` does, in place, keeping the module's
    type, parameters and state_dict keys), so accumulation, `no_sync` and checkpoints work
    exactly as with the plain model. Compilation itself happens lazily at the first call;
    `smoke_test_compile` runs one step to surface a broken toolchain early.
    """
    if not enabled:
        return CompileResult(model, False, "not requested")
    reason = compile_available()
    if reason is not None:
        log.warning("torch.compile requested but skipped: %s", reason)
        return CompileResult(model, False, reason)
    # A frame that fails to compile runs eagerly instead of raising mid-step (compile_watch
    # says so as an event): the same arithmetic, without the speed-up.
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True
    model.compile(mode=mode)
    return CompileResult(model, True, "compiled")


def prepare(
    model: nn.Module,
    optimizer_cfg: Mapping[str, Any],
    device: str | torch.device,
    precision: str = "fp32",
    *,
    compile: bool = False,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Move the model to `device`, apply channels_last and compile, build a fast optimizer.

    Args:
        model: any nn.Module, on any device.
        optimizer_cfg: {"name": "sgd"|"adam"|"adamw", "lr": float, and optionally
            "momentum", "weight_decay", "betas", "eps"} as for `make_optimizer`.
        device: "cpu", "cuda", "cuda:1", ...
        precision: "fp32" | "bf16" | "fp16"; parameters stay fp32 in every case (the trainer
            autocasts), so this only checks the value.
        compile: wrap the forward with torch.compile (skipped with a warning when impossible).

    Returns:
        (model, optimizer), the optimizer built over the moved model's parameters.
    """
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be one of fp32, bf16, fp16, got {precision!r}")
    cfg = dict(optimizer_cfg)
    if "name" not in cfg or "lr" not in cfg:
        raise ValueError(f"optimizer_cfg needs 'name' and 'lr', got keys {sorted(cfg)}")
    model = model.to(device)
    model = use_channels_last(model, device)
    model = maybe_compile(model, compile).model
    name = cfg.pop("name")
    lr = float(cfg.pop("lr"))
    if "betas" in cfg:
        cfg["betas"] = tuple(cfg["betas"])
    optimizer = make_optimizer(name, model.parameters(), lr, device=device, **cfg)
    return model, optimizer


def host_loader(loader: Any) -> Any:
    """The loader whose batches stay on the host: a ``CudaPrefetcher``'s own loader, else
    ``loader`` itself (the feed copies each micro-batch just before its forward instead)."""
    return loader.loader if isinstance(loader, CudaPrefetcher) else loader

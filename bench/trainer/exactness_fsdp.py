"""The FSDP row of bench/trainer/exactness.py: 2 gloo ranks on the CPU with uneven shards.

``fsdp_uneven_shards``: rank 0 holds 7 samples, rank 1 holds 6 (contiguous shards of 13), m=2,
N=2, 2 epochs of SGD with momentum in float64: in each epoch's last window rank 0 has two
micro-batches and rank 1 one. Figure: max relative error of the final weights vs a one-process
float64 big-batch step per window (window w = every rank's window w). Each rank trains its own
shard (no sampler re-dealing the data), as a job whose data is split per rank does.

- accum: ``accumcore.shard`` (FSDP2) + ``Trainer``, in both ``fsdp_sync`` modes.
- Lightning: ``FSDPStrategy`` (FSDP1) and ``ModelParallelStrategy`` (FSDP2, ``fully_shard`` in
  ``configure_model``), ``accumulate_grad_batches=N``, ``use_distributed_sampler=False``.
- Accelerate: ``FullyShardedDataParallelPlugin`` (FSDP2) with ``gradient_accumulation_steps=N``.
The peers' ranks are started as ``torchrun`` / ``accelerate launch`` would (environment
variables), each under a timeout: a peer that refuses FSDP on the CPU, fails, or hangs (a rank
with fewer passes leaves the other waiting in a collective) is recorded as such, never a figure.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from services.ports import free_port

SHARDS = (7, 6)
EVEN_SHARDS = (6, 6)  # the control: the same FSDP2 run without the uneven shard
WORLD = len(SHARDS)
M, N, EPOCHS = 2, 2, 2
LR, MOMENTUM = 0.1, 0.5
TIMEOUT_S = 120.0


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(29)
    return TensorDataset(torch.randn(sum(SHARDS), 6, generator=g, dtype=torch.float64),
                         torch.randint(0, 3, (sum(SHARDS),), generator=g))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _shard(rank: int, sizes: tuple[int, ...]) -> TensorDataset:
    x, y = _data().tensors
    start = sum(sizes[:rank])
    return TensorDataset(x[start : start + sizes[rank]], y[start : start + sizes[rank]])


def _optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def _big_batch_final(sizes: tuple[int, ...]) -> nn.Module:
    """One float64 step per window, over every rank's micro-batches of that window."""
    model = _model()
    optimizer = _optimizer(model.parameters())
    shards = [list(DataLoader(_shard(r, sizes), batch_size=M)) for r in range(WORLD)]
    for _ in range(EPOCHS):
        for w in range(max(math.ceil(len(s) / N) for s in shards)):
            window = [b for s in shards for b in s[N * w : N * w + N]]
            inputs = torch.cat([x for x, _ in window])
            targets = torch.cat([y for _, y in window])
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model


def _relative(params: list[torch.Tensor], reference: nn.Module) -> float:
    scale = max(float(q.detach().abs().max()) for q in reference.parameters())
    return max(float((p - q.detach()).abs().max()) for p, q in zip(params, reference.parameters(), strict=True)) / scale


def _full(params: Any) -> list[torch.Tensor]:
    """Every rank calls it (a DTensor's full_tensor is an all-gather)."""
    return [p.full_tensor().detach() if hasattr(p, "full_tensor") else p.detach() for p in params]


def _launch_env(rank: int, port: int) -> None:
    """What torchrun / `accelerate launch` give each rank; the peers then start no processes."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
                      NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


Body = Callable[[int, str, tuple[int, ...]], None]  # (rank, folder, shard sizes)


def _rank(rank: int, body: Body, port: int, folder: str, sizes: tuple[int, ...]) -> None:
    """One rank: ``body`` trains and rank 0 saves the final weights to ``folder/weights.pt``.
    An exception is written down (its phase: ``setup`` until the first micro-batch) and re-raised."""
    _launch_env(rank, port)
    phase = Path(folder, f"phase{rank}")
    _write_whole(phase, "setup")
    try:
        body(rank, folder, sizes)
    except BaseException as error:
        first = (str(error).strip().splitlines() or [""])[0]
        _write_whole(Path(folder, f"error{rank}.json"), json.dumps(
            {"phase": phase.read_text(), "error": f"{type(error).__name__}: {first}"[:300]}))
        raise


def _write_whole(path: Path, text: str) -> None:
    """``text`` at ``path`` in one rename: a rank killed while writing (spawn terminates the
    other ranks once one raises) leaves the old file or none, never a half-written one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def _training(folder: str, rank: int) -> None:
    """Called at each of a peer's micro-batches: the phase file counts them."""
    phase = Path(folder, f"phase{rank}")
    text = phase.read_text()
    _write_whole(phase, f"training {int(text.split()[1]) + 1 if text.startswith('training') else 1}")


def _hung(folder: str, alive: list[bool], timeout_s: float) -> str:
    phases = [Path(folder, f"phase{r}").read_text() for r in range(WORLD)]
    where = ", ".join(f"rank {r} {'waiting' if alive[r] else 'exited'} "
                      + (f"after {phase.split()[1]} micro-batches" if phase.startswith("training") else "in setup")
                      for r, phase in enumerate(phases))
    if any(not phase.startswith("training") for phase in phases):
        return f"hung in setup: {where} (killed after {timeout_s:.0f} s)"
    return (f"hung: {where}; the ranks ran different numbers of passes, one waiting in a collective the other "
            f"never joins (killed after {timeout_s:.0f} s)")


def _save(rank: int, folder: str, params: list[torch.Tensor]) -> None:
    if rank == 0:
        torch.save(params, Path(folder, "weights.pt"))


# ------------------------------------------------------------------------------- accum
def _accum(sync: str) -> Body:
    def body(rank: int, folder: str, sizes: tuple[int, ...]) -> None:
        import accumcore
        from accumcore import Trainer

        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        try:
            model = accumcore.shard(_model())
            trainer = Trainer(model, _optimizer(model.parameters()), loss_fn=nn.CrossEntropyLoss(),
                              accumulation_steps=N, fsdp_sync=sync)
            Path(folder, f"phase{rank}").write_text("training -")
            trainer.fit(DataLoader(_shard(rank, sizes), batch_size=M), epochs=EPOCHS)
            _save(rank, folder, _full(model.parameters()))
        finally:
            dist.destroy_process_group()
    return body


# --------------------------------------------------------------------------- Lightning
def _lightning(strategy_name: str) -> Body:
    def body(rank: int, folder: str, sizes: tuple[int, ...]) -> None:
        import lightning as L
        from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

        from bench.harness.peer_runs import _quiet

        _quiet()

        class Module(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.model = _model()

            def configure_model(self) -> None:
                if strategy_name == "model_parallel":  # FSDP2 as Lightning's docs teach it
                    from torch.distributed.fsdp import fully_shard

                    mesh = self.device_mesh["data_parallel"]
                    for layer in [m for m in self.model.children() if isinstance(m, nn.Linear)]:
                        fully_shard(layer, mesh=mesh)
                    fully_shard(self.model, mesh=mesh)

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                _training(folder, rank)
                inputs, targets = batch
                return nn.functional.cross_entropy(self.model(inputs), targets)

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return _optimizer(self.model.parameters())

            def on_train_end(self) -> None:
                _save(rank, folder, _full(self.model.parameters()))

        strategy = (FSDPStrategy() if strategy_name == "fsdp"
                    else ModelParallelStrategy(data_parallel_size=WORLD, tensor_parallel_size=1))
        trainer = L.Trainer(accelerator="cpu", devices=WORLD, strategy=strategy, max_epochs=EPOCHS,
                            accumulate_grad_batches=N, use_distributed_sampler=False, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            # "32-true" leaves the float64 model as it is; ModelParallelStrategy
                            # refuses "64-true" (it offers 32-true, bf16-mixed, bf16-true, 16-true).
                            num_sanity_val_steps=0, precision="32-true")
        trainer.fit(Module(), DataLoader(_shard(rank, sizes), batch_size=M))
    return body


# -------------------------------------------------------------------------- Accelerate
class NotShardedError(RuntimeError):
    """A peer that accepted the FSDP options on the CPU but trains an unsharded model."""


def _accelerate(rank: int, folder: str, sizes: tuple[int, ...]) -> None:
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DistributedType
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    from bench.harness.peer_runs import _quiet

    _quiet()
    # A forked rank inherits the parent's process-wide singletons (the parent's one-process runs).
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(gradient_accumulation_steps=N, cpu=True,
                              fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    model = _model()
    optimizer = _optimizer(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    if not any(isinstance(m, FSDPModule | FullyShardedDataParallel) for m in model.modules()):
        wrapped = type(model).__name__
        kind = accelerator.distributed_type
        raise NotShardedError(f"no error raised, but Accelerator(cpu=True, fsdp_plugin=...) runs distributed_type "
                           f"{kind.value if isinstance(kind, DistributedType) else kind}: the FSDP plugin is "
                           f"ignored and prepare() wraps the model in {wrapped}, unsharded")
    _training(folder, rank)
    model.train()
    for _ in range(EPOCHS):  # the loop of Accelerate's docs, over this rank's own shard
        for inputs, targets in DataLoader(_shard(rank, sizes), batch_size=M):
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.cross_entropy(model(inputs), targets))
                optimizer.step()
                optimizer.zero_grad()
    _save(rank, folder, _full(accelerator.unwrap_model(model).parameters()))
    accelerator.end_training()


# ----------------------------------------------------------------------------- running
def _run(body: Body, sizes: tuple[int, ...], timeout_s: float, reference: nn.Module | None = None) -> dict[str, Any]:
    """WORLD forked ranks of ``body`` on shards of ``sizes``: {"error": relative error of the
    final weights vs ``reference`` (default: this row's big batch on ``sizes``), "dtype"} or
    {"status": why there is no figure}. exactness_corners.py runs its DDP row through it too."""
    with tempfile.TemporaryDirectory() as folder:
        context = mp.start_processes(_rank, args=(body, free_port(), folder, sizes), nprocs=WORLD, join=False,
                                     start_method="fork")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    alive = [process.is_alive() for process in context.processes]
                    for process in context.processes:
                        if process.is_alive():
                            process.kill()
                            process.join()
                    return {"status": _hung(folder, alive, timeout_s)}
        except mp.ProcessRaisedException:
            errors = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("error*.json"))]
            if not errors:
                return {"status": "failed: a rank raised without saying what"}
            first = errors[0]
            if first["error"].startswith(NotShardedError.__name__):
                return {"status": "not sharded on CPU: " + first["error"].split(": ", 1)[1]}
            return {"status": ("refused on CPU: " if first["phase"] == "setup" else "failed: ") + first["error"]}
        except mp.ProcessExitedException as error:
            return {"status": f"failed: a rank exited ({error})"[:300]}
        weights = torch.load(Path(folder, "weights.pt"))
        return {"error": _relative(weights, _big_batch_final(sizes) if reference is None else reference),
                "dtype": str(weights[0].dtype).removeprefix("torch.")}


def fsdp_uneven_shards(peers_ok: bool, timeout_s: float = TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """accum in both sync modes, and where the peers are installed, Lightning's two FSDP
    strategies and Accelerate's plugin; a Lightning FSDP2 run on even shards (6 and 6) as the
    control that tells a hang on the uneven shard from one of FSDP on the CPU."""
    runs: dict[str, tuple[Body, tuple[int, ...]]] = {
        "accum": (_accum("micro_batch"), SHARDS), "accum_window_sync": (_accum("window"), SHARDS)}
    if peers_ok:
        runs.update({"lightning": (_lightning("model_parallel"), SHARDS),
                     "lightning_fsdp1": (_lightning("fsdp"), SHARDS),
                     "accelerate": (_accelerate, SHARDS),
                     "lightning_even_shards": (_lightning("model_parallel"), EVEN_SHARDS)})
    table = {name: _run(body, sizes, timeout_s) for name, (body, sizes) in runs.items()}
    for name, (_, sizes) in runs.items():
        table[name]["shards"] = list(sizes)
    return table

"""The corner cases of bench/trainer/exactness.py: resume on a plain DataLoader, and 2 DDP
ranks with uneven shards, for accum and, where they apply, Lightning and Accelerate.

- ``plain_loader_resume``: a run stopped after k optimizer steps and resumed in fresh objects
  (after the process drew other random numbers) vs the uninterrupted run, on
  ``DataLoader(shuffle=True)`` without a generator and a model with dropout: bitwise or not,
  and the max abs difference of the final weights. Each framework resumes as its docs teach:
  accum ``state_dict``/``load_state_dict``; Lightning ``save_checkpoint`` + ``fit(ckpt_path=)``;
  Accelerate ``save_state``/``load_state`` + ``skip_first_batches``.
- ``ddp_uneven_shards``: 2 gloo ranks, 9 samples (rank r gets samples r, r+2, ...), m=2, N=2:
  rank 1 has no micro-batch in the 2nd window. Max relative error of the final weights vs a
  float64 big-batch step per window over the same samples. Lightning: ``strategy="ddp"``
  with its default DistributedSampler; Accelerate: its loader sharded by ``prepare``
  (``even_batches=True``). Both even the shards out by repeating samples. Every run's ranks
  are forked and set up as ``torchrun`` / ``accelerate launch`` would (environment variables)
  by ``exactness_fsdp._run``, under a timeout (a hang is recorded as one); each Accelerate
  rank resets the Accelerate singletons it inherits from the bench's one-process runs.
"""

from __future__ import annotations

import math
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.trainer import exactness_fsdp as _fsdp

RESUME_EPOCHS = 2
RESUME_STOP_AFTER = 8  # optimizer steps: inside the 2nd epoch (6 windows per epoch)
LR = 0.1


def _seed(value: int) -> None:
    torch.manual_seed(value)
    np.random.seed(value)
    random.seed(value)


def _resume_data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(22, 6, generator=g), torch.randint(0, 3, (22,), generator=g))


def _resume_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))


def _loader() -> DataLoader[Any]:
    return DataLoader(_resume_data(), batch_size=2, shuffle=True)


def _difference(a: nn.Module, b: nn.Module) -> dict[str, Any]:
    diff = max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    return {"bitwise": diff == 0.0, "max_abs_diff": diff}


def _accum_resume() -> dict[str, Any]:
    from accumcore import Trainer

    def trainer(model: nn.Module) -> Trainer:
        return Trainer(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                       loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2)

    _seed(1)
    full = _resume_model()
    trainer(full).fit(_loader(), epochs=RESUME_EPOCHS)
    _seed(1)
    first = trainer(_resume_model())
    first.fit(_loader(), epochs=RESUME_EPOCHS, max_steps=RESUME_STOP_AFTER)
    state = first.state_dict()
    _seed(123)
    torch.randn(7)
    resumed_model = _resume_model()
    resumed = trainer(resumed_model)
    resumed.load_state_dict(state)
    resumed.fit(_loader(), epochs=RESUME_EPOCHS)
    return _difference(full, resumed_model)


def _lightning_resume() -> dict[str, Any]:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, targets = batch
            return nn.functional.cross_entropy(self.model(inputs), targets)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.model.parameters(), lr=LR, momentum=0.9)

    def trainer(max_steps: int) -> Any:
        return L.Trainer(accelerator="cpu", devices=1, max_epochs=RESUME_EPOCHS, max_steps=max_steps,
                         accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)

    _seed(1)
    full = _resume_model()
    trainer(-1).fit(Module(full), _loader())
    _seed(1)
    first = trainer(RESUME_STOP_AFTER)
    first.fit(Module(_resume_model()), _loader())
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "stop.ckpt"
        first.save_checkpoint(path)
        _seed(123)
        torch.randn(7)
        resumed = _resume_model()
        trainer(-1).fit(Module(resumed), _loader(), ckpt_path=path)
    return _difference(full, resumed)


def _accelerate_resume() -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    windows = math.ceil(len(_loader()) / 2)

    def run(model: nn.Module, state_dir: str | None, save_to: str | None) -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
        steps = 0
        if state_dir is not None:
            accelerator.load_state(state_dir)
            steps = RESUME_STOP_AFTER
        model.train()
        for epoch in range(steps // windows, RESUME_EPOCHS):
            skip = (steps - epoch * windows) * 2
            batches = accelerator.skip_first_batches(loader, skip) if skip else loader
            for inputs, targets in batches:
                with accelerator.accumulate(model):
                    accelerator.backward(nn.functional.cross_entropy(model(inputs), targets))
                    optimizer.step()
                    optimizer.zero_grad()
                if accelerator.sync_gradients:
                    steps += 1
                    if save_to is not None and steps == RESUME_STOP_AFTER:
                        accelerator.save_state(save_to)
                        return

    _seed(1)
    full = _resume_model()
    run(full, None, None)
    with tempfile.TemporaryDirectory() as folder:
        _seed(1)
        run(_resume_model(), None, folder)
        _seed(123)
        torch.randn(7)
        resumed = _resume_model()
        run(resumed, folder, None)
    return _difference(full, resumed)


def plain_loader_resume(peers_ok: bool) -> dict[str, dict[str, Any]]:
    from bench.harness.peer_runs import _quiet

    table = {"accum": _accum_resume()}
    if peers_ok:
        _quiet()
        table["lightning"] = _lightning_resume()
        table["accelerate"] = _accelerate_resume()
    return table


# ------------------------------------------------------------------- DDP, uneven shards
DDP_SAMPLES, DDP_WORLD = 9, _fsdp.WORLD
DDP_SIZES = (5, 4)  # samples per rank (rank r: samples r, r+2, ...); what _fsdp._run is told
DDP_TIMEOUT_S = 120.0


def _ddp_data() -> TensorDataset:
    g = torch.Generator().manual_seed(9)
    return TensorDataset(torch.randn(DDP_SAMPLES, 6, generator=g, dtype=torch.float64),
                         torch.randint(0, 3, (DDP_SAMPLES,), generator=g))


def _ddp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _ddp_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.5)


def _shard(rank: int) -> TensorDataset:
    x, y = _ddp_data().tensors
    return TensorDataset(x[rank::DDP_WORLD], y[rank::DDP_WORLD])


def _big_batch_final() -> nn.Module:
    """Window w = both ranks' window w (samples r, r+2, ... in order), one float64 step each."""
    model = _ddp_model()
    optimizer = _ddp_optimizer(model.parameters())
    shards = [list(DataLoader(_shard(r), batch_size=2)) for r in range(DDP_WORLD)]
    for w in range(max(math.ceil(len(s) / 2) for s in shards)):
        window = [b for s in shards for b in s[2 * w : 2 * w + 2]]
        x = torch.cat([x for x, _ in window])
        y = torch.cat([y for _, y in window])
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


# Each body is one rank, forked and set up as torchrun / `accelerate launch` would (environment
# variables) by exactness_fsdp._run, which kills the ranks after a timeout and says where they were.
def _accum_ddp(rank: int, folder: str, sizes: tuple[int, ...]) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from accumcore import Trainer

    dist.init_process_group("gloo", rank=rank, world_size=DDP_WORLD)
    try:
        model = DistributedDataParallel(_ddp_model())
        trainer = Trainer(model, _ddp_optimizer(model.parameters()), loss_fn=nn.CrossEntropyLoss(),
                          accumulation_steps=2)
        Path(folder, f"phase{rank}").write_text("training -")
        trainer.fit(DataLoader(_shard(rank), batch_size=2), epochs=1)
        _fsdp._save(rank, folder, [p.detach() for p in model.module.parameters()])
    finally:
        dist.destroy_process_group()


def _lightning_ddp(rank: int, folder: str, sizes: tuple[int, ...]) -> None:
    import lightning as L

    from bench.harness.peer_runs import _quiet

    _quiet()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _ddp_model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            _fsdp._training(folder, rank)
            inputs, targets = batch
            return nn.functional.cross_entropy(self.model(inputs), targets)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return _ddp_optimizer(self.model.parameters())

        def on_train_end(self) -> None:
            _fsdp._save(rank, folder, [p.detach() for p in self.model.parameters()])

    # strategy="ddp" on ranks started outside (LOCAL_RANK set: Lightning launches nothing).
    trainer = L.Trainer(accelerator="cpu", devices=DDP_WORLD, strategy="ddp", max_epochs=1,
                        accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        precision="64-true")
    # The whole dataset, in order: Lightning shards it with a DistributedSampler (no shuffle),
    # rank r reading samples r, r+2, ... and padding the shorter rank by repeating a sample.
    trainer.fit(Module(), DataLoader(_ddp_data(), batch_size=2, shuffle=False))


def _accelerate_ddp(rank: int, folder: str, sizes: tuple[int, ...]) -> None:
    """One process of Accelerate's multi-CPU mode."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from bench.harness.peer_runs import _quiet

    _quiet()
    # A forked rank inherits the parent's process-wide singletons (the bench's one-process
    # runs, distributed_type NO): without this reset each rank trains alone on every sample.
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model = _ddp_model()
    optimizer = _ddp_optimizer(model.parameters())
    # The whole dataset, in order: prepare() shards it (rank r: samples r, r+2, ... per batch
    # of the even_batches=True default, which pads the shorter rank with samples from the start).
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(_ddp_data(), batch_size=2))
    model.train()
    for inputs, targets in loader:
        _fsdp._training(folder, rank)
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.cross_entropy(model(inputs), targets))
            optimizer.step()
            optimizer.zero_grad()
    _fsdp._save(rank, folder, [p.detach() for p in accelerator.unwrap_model(model).parameters()])
    accelerator.end_training()


def ddp_uneven_shards(peers_ok: bool, timeout_s: float = DDP_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """accum, and where the peers are installed Lightning and Accelerate, each as DDP_WORLD
    forked ranks under ``timeout_s`` (a hang or a refusal is recorded as such, not a figure)."""
    reference = _big_batch_final()
    bodies: dict[str, _fsdp.Body] = {"accum": _accum_ddp}
    if peers_ok:
        bodies.update(lightning=_lightning_ddp, accelerate=_accelerate_ddp)
    return {name: _fsdp._run(body, DDP_SIZES, timeout_s, reference) for name, body in bodies.items()}

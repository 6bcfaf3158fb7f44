"""One rank of the FSDP tests (run by torch.multiprocessing from test_trainer_fsdp.py).

``run_shards``: each rank trains its own shard (sizes ``SHARDS[world]``: 7 and 6 samples on 2
ranks, 5, 4 and 4 on 3) of padded token sequences, so in each epoch's last window a rank has
fewer micro-batches than another, or none, and joins the others' passes with zero-weight ones.
``run_windows``: the global windows of ``global_windows()`` split over the ranks (the order a
world-size-invariant sampler gives), for checkpoints that resume at another world size.
"""

from __future__ import annotations

import copy
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from trainer_reference import TokenCrossEntropy, token_dataset, token_model

import accumcore
from accumcore import Trainer
from accumcore.data import make_loader

MICRO_BATCH = 2
ACCUMULATION = 2
EPOCHS = 2
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.5, 0.01
CLIP = 0.3  # below the windows' gradient norms: clipping acts on every step
SHARDS = {2: (7, 6), 3: (5, 4, 4)}
WINDOW_SAMPLES = 8  # effective batch of run_windows; 13 samples: windows of 8 and 5


def shard(world: int, rank: int) -> torch.utils.data.TensorDataset:
    sizes = SHARDS[world]
    tokens, targets = token_dataset(sum(sizes), seed=12).tensors
    start = sum(sizes[:rank])
    return torch.utils.data.TensorDataset(tokens[start : start + sizes[rank]], targets[start : start + sizes[rank]])


# Validation batches: 2 on rank 0, 1 on the others; on 3 ranks, none on rank 2, which joins
# the others' forwards on 0 rows of their batches' shape.
VAL_SHARDS = {2: (3, 1), 3: (4, 1, 0)}


def val_shard(world: int, rank: int) -> torch.utils.data.TensorDataset:
    sizes = VAL_SHARDS[world]
    tokens, targets = token_dataset(sum(sizes), seed=14).tensors
    start = sum(sizes[:rank])
    return torch.utils.data.TensorDataset(tokens[start : start + sizes[rank]], targets[start : start + sizes[rank]])


def global_windows() -> list[tuple[torch.Tensor, torch.Tensor]]:
    tokens, targets = token_dataset(13, seed=13).tensors
    return [(tokens[i : i + WINDOW_SAMPLES], targets[i : i + WINDOW_SAMPLES]) for i in range(0, 13, WINDOW_SAMPLES)]


def window_batches(world: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's micro-batches of one epoch: its part of each global window, in
    ``ACCUMULATION`` pieces (fewer where its part is smaller: the last window)."""
    batches = []
    for tokens, targets in global_windows():
        mine = torch.tensor_split(torch.arange(tokens.shape[0]), world)[rank]
        for piece in torch.tensor_split(mine, ACCUMULATION):
            if len(piece):
                batches.append((tokens[piece], targets[piece]))
    return batches


def new_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def full_params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.full_tensor().detach() if hasattr(p, "full_tensor") else p.detach() for p in model.parameters()]


def _init(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    # FSDP2 warns for every module whose output is a view (a Linear on 3-D inputs); no test
    # here writes to an output in place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")


def _result(trainer: Trainer, history: Any, model: torch.nn.Module, **extra: Any) -> dict[str, Any]:
    return {"params": full_params(model), "losses": [s["loss"] for s in history.steps],
            "grad_norms": [s["grad_norm"] for s in history.steps], "steps": trainer.global_step,
            "events": [e["kind"] for e in history.events], **extra}


def count_reduce_scatters() -> dict[str, int]:
    """Counts FSDP's gradient reduce-scatters (it calls ``dist.reduce_scatter_single``)."""
    counter = {"count": 0}
    original = dist.reduce_scatter_single

    def counting(*args: Any, **kwargs: Any) -> Any:
        counter["count"] += 1
        return original(*args, **kwargs)

    dist.reduce_scatter_single = counting
    return counter


def run_shards(rank: int, world: int, sync: str, init_file: str, out_dir: str, checkpoint_every: int = 0,
               resume_from: str = "") -> None:
    """Train every epoch (with a checkpoint every ``checkpoint_every`` steps when given); or,
    given ``resume_from`` (one of those checkpoints), resume from it and train the rest."""
    _init(rank, world, init_file)
    try:
        reduce_scatters = count_reduce_scatters()
        model = accumcore.shard(copy.deepcopy(token_model(torch.float64)))
        optimizer = new_optimizer(model)
        trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=ACCUMULATION,
                          grad_clip_norm=CLIP, fsdp_sync=sync, checkpoint_every=checkpoint_every or None,
                          checkpoint_dir=Path(out_dir) / "checkpoints" if checkpoint_every else None)
        if resume_from:
            trainer.load_state_dict(accumcore.load_checkpoint(resume_from, model=model, optimizer=optimizer))
        history = trainer.fit(make_loader(shard(world, rank), MICRO_BATCH, shuffle=False), epochs=EPOCHS,
                              val_loader=torch.utils.data.DataLoader(val_shard(world, rank), MICRO_BATCH))
        torch.save(_result(trainer, history, model, reduce_scatters=reduce_scatters["count"],
                           val_loss=history.evals[-1]["val_loss"]),
                   Path(out_dir) / f"{'resumed-' if resume_from else ''}rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_windows(rank: int, world: int, case: str, init_file: str, out_dir: str, checkpoint: str = "") -> None:
    """``case`` "first": epoch 0, a checkpoint at its end; "resume": epoch 1 from
    ``checkpoint`` (a sharded checkpoint's directory, or a plain trainer's file)."""
    _init(rank, world, init_file)
    try:
        model = accumcore.shard(copy.deepcopy(token_model(torch.float64)))
        optimizer = new_optimizer(model)
        trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=ACCUMULATION,
                          grad_clip_norm=CLIP, checkpoint_dir=Path(out_dir) / "checkpoints", fsdp_sync="window")
        if case == "resume":
            trainer.load_state_dict(accumcore.load_checkpoint(checkpoint, model=model, optimizer=optimizer))
        history = trainer.fit(window_batches(world, rank), epochs=1 if case == "first" else EPOCHS)
        torch.save(_result(trainer, history, model), Path(out_dir) / f"{case}{world}-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_policies(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """bf16 parameters with fp32 reductions and CPU offload train (float32, AdamW); what a
    sharded model cannot do exactly is refused."""
    _init(rank, world, init_file)
    try:
        refusals = []
        def unmarked_mean(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return TokenCrossEntropy()(outputs, targets)

        for options in ({"precision": "fp16"}, {"loss_fn": unmarked_mean}):
            model = accumcore.shard(token_model(torch.float32))
            try:
                Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), **{"loss_fn": TokenCrossEntropy(), **options})
            except ValueError as exc:
                refusals.append(str(exc))
        model = accumcore.shard(token_model(torch.float32), mixed_precision=True, cpu_offload=True)
        before = full_params(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
        trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=ACCUMULATION, grad_clip_norm=1.0)
        history = trainer.fit(make_loader(shard(world, rank), MICRO_BATCH, shuffle=False), epochs=4)
        grad_free = all(p.grad is None for p in model.parameters())
        with torch.no_grad():  # a forward is a collective: every rank runs it
            output_dtype = str(model(shard(world, rank).tensors[0][:2]).dtype)
        torch.save(_result(trainer, history, model, before=before, refusals=refusals, grad_free=grad_free, output_dtype=output_dtype,
                           param_dtypes=sorted({str(p.dtype) for p in model.parameters()})),
                   Path(out_dir) / f"policies-rank{rank}.pt")
    finally:
        dist.destroy_process_group()

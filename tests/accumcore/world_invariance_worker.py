"""One rank of the world-size invariance tests (run by torch.multiprocessing from
test_trainer_world_invariance.py), and the same training in one process (``train``).

Every rank reads the whole dataset through ``make_loader(rank=..., world=...)``; the Trainer's
``accumulation_steps`` counts a global window's micro-batches over all ranks. The data: 35
padded token sequences (item counts differ per micro-batch), micro-batches of 2 (the epoch's
last holds 1 sample), windows of 8 micro-batches: 8, 8 and a short last window of 2, which
3 ranks share as 3, 3, 2 and then 1, 1, 0 (rank 2 joins that window with no micro-batch).

Each rank also trains a dropout MLP (``train_dropout``: 23 samples, micro-batches of 2, windows
of 8 then 4), its process seeded apart from the other ranks (as a user seeding ``seed + rank``
would), recording every dropout mask it draws: with randomness keyed by the global
micro-batch, the masks and the trajectory are those of one process.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from trainer_reference import TokenCrossEntropy, class_dataset, token_dataset, token_model

from accumcore import Trainer, load_checkpoint
from accumcore.data import make_loader

SAMPLES = 35
MICRO_BATCH = 2
WINDOW = 8  # micro-batches per optimizer step, all ranks together
EPOCHS = 2
SEED = 7
CHECKPOINT_STEP = 4  # epoch 1, after its first window: a resume inside an epoch
DROPOUT_SAMPLES = 23  # 12 micro-batches of 2 (the last 1): windows of 8 and 4; 3, 3, 2 and 2, 1, 1 on 3 ranks
DROPOUT_CHECKPOINT_STEP = 3  # epoch 1, after its first window


class RecordingDropout(nn.Dropout):
    """nn.Dropout that keeps each training forward's mask (the zeroed elements)."""

    def __init__(self, p: float) -> None:
        super().__init__(p)
        self.masks: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            self.masks.append((out == 0).detach().clone())  # float64 after a Linear: never 0 otherwise
        return out


def dropout_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), RecordingDropout(0.3), nn.Tanh(), nn.Linear(16, 3)).to(torch.float64)


def dataset() -> torch.utils.data.TensorDataset:
    return token_dataset(SAMPLES, seed=13)


def train(rank: int, world: int, checkpoint_dir: Path | None = None, resume: Path | None = None) -> dict:
    """Train (DDP-wrapped when ``world`` > 1, inside its process group); the final weights
    and the logged steps."""
    model: torch.nn.Module = token_model(torch.float64)
    if world > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    trainer = Trainer(
        model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=WINDOW,
        checkpoint_dir=checkpoint_dir, checkpoint_every=CHECKPOINT_STEP if checkpoint_dir else None,
    )
    if resume is not None:
        trainer.load_state_dict(load_checkpoint(resume))
    history = trainer.fit(make_loader(dataset(), MICRO_BATCH, seed=SEED, rank=rank, world=world), epochs=EPOCHS)
    plain = model.module if isinstance(model, DistributedDataParallel) else model
    return {
        "params": [p.detach().clone() for p in plain.parameters()],
        "steps": [int(s["step"]) for s in history.steps],
        "losses": [s["loss"] for s in history.steps],
        "items": [round(s["items_per_s"] * s["step_time_s"]) for s in history.steps],
    }


def train_dropout(rank: int, world: int, checkpoint_dir: Path | None = None, resume: Path | None = None) -> dict:
    """The dropout MLP (DDP-wrapped when ``world`` > 1) on a process seeded ``100 + rank``:
    the Trainer's seed (None) is rank 0's. Final weights, logged losses, every mask drawn, and
    whether the process's own CPU generator moved."""
    model: torch.nn.Module = dropout_model()
    recorder = model[1]
    if world > 1:
        model = DistributedDataParallel(model)
    torch.manual_seed(100 + rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    trainer = Trainer(
        model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=WINDOW, checkpoint_dir=checkpoint_dir,
        checkpoint_every=DROPOUT_CHECKPOINT_STEP if checkpoint_dir else None,
    )
    if resume is not None:
        trainer.load_state_dict(load_checkpoint(resume))
    loader = make_loader(class_dataset(DROPOUT_SAMPLES, torch.float64), MICRO_BATCH, seed=SEED, rank=rank, world=world)
    before = torch.get_rng_state()
    history = trainer.fit(loader, epochs=EPOCHS)
    plain = model.module if isinstance(model, DistributedDataParallel) else model
    return {
        "params": [p.detach().clone() for p in plain.parameters()],
        "losses": [s["loss"] for s in history.steps],
        "masks": recorder.masks,
        "own_rng_kept": torch.equal(before, torch.get_rng_state()),
    }


def run(rank: int, world: int, init_file: str, out_dir: str, checkpoint_dir: str | None, resume: str | None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        result = train(rank, world, Path(checkpoint_dir) if checkpoint_dir else None,
                       Path(resume) if resume else None)
        # The dropout MLP in the same processes: its checkpoints in checkpoint_dir/dropout, its
        # resume from the file of that folder next to the token model's checkpoint.
        result["dropout"] = train_dropout(
            rank, world, Path(checkpoint_dir) / "dropout" if checkpoint_dir else None,
            Path(resume).parent / "dropout" / f"{DROPOUT_CHECKPOINT_STEP}.pt" if resume else None,
        )
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()

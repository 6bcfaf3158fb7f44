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

And two real models (issue 41): a BatchNorm CNN (``train_batchnorm``: its running statistics
replayed in the global micro-batch order on every rank, ``accumcore.batchnorm_sync``; each rank
evaluates its slice of the validation set) and a tiny GPT-2 with dropout 0.3 built from
transformers' config (``train_dropout_lm``: no download), each rank's process seeded apart.
"""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from trainer_reference import VOCAB, TokenCrossEntropy, class_dataset, token_dataset, token_model

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


BN_SAMPLES = 23  # 12 micro-batches of 2 (the last 1): windows of 4
BN_WINDOW = 4


def batchnorm_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3),
    ).to(torch.float64)


def image_dataset(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(n, 1, 4, 4, generator=g, dtype=torch.float64) * 2 + 1,
                                          torch.randint(0, 3, (n,), generator=g))


def _plain(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def train_batchnorm(rank: int, world: int) -> dict:
    """The BatchNorm CNN (DDP-wrapped when ``world`` > 1): final weights, buffers (running
    statistics and batches tracked), logged losses and val_loss after each epoch."""
    model: nn.Module = batchnorm_model()
    if world > 1:
        model = DistributedDataParallel(model)
    torch.manual_seed(100 + rank)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                      loss_fn=nn.CrossEntropyLoss(), accumulation_steps=BN_WINDOW)
    val = image_dataset(9, seed=5)
    val_slice = torch.utils.data.Subset(val, list(range(rank, len(val), world)))
    history = trainer.fit(make_loader(image_dataset(BN_SAMPLES, seed=4), MICRO_BATCH, seed=SEED, rank=rank, world=world),
                          epochs=EPOCHS, val_loader=torch.utils.data.DataLoader(val_slice, batch_size=2))
    plain = _plain(model)
    torch.save(plain, io.BytesIO())  # the whole module pickles: no hook of the trainer's left on it
    return {"params": [p.detach().clone() for p in plain.parameters()],
            "buffers": [b.detach().clone() for b in plain.buffers()],
            "hooks": sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in plain.modules()),
            "losses": [s["loss"] for s in history.steps],
            "val_losses": [e["val_loss"] for e in history.evals]}


LM_SAMPLES = 13  # 7 micro-batches of 2 (the last 1): windows of 4 and 3


class ShiftedTokenCrossEntropy(nn.Module):
    """The causal LM's token-mean cross-entropy of logits[..., :-1] against labels[..., 1:], in
    float64 (a stock Hugging Face loss casts the logits to float32)."""

    reduction = "mean"
    ignore_index = -100

    def forward(self, outputs, labels: torch.Tensor) -> torch.Tensor:
        logits = outputs.logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def dropout_lm() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                        resid_pdrop=0.3, embd_pdrop=0.3, attn_pdrop=0.3)
    return GPT2LMHeadModel(config).to(torch.float64)


def train_dropout_lm(rank: int, world: int) -> dict:
    """The tiny dropout GPT-2 on padded token sequences (labels -100 after each one's length),
    DDP-wrapped when ``world`` > 1, each rank's process seeded apart."""
    model: nn.Module = dropout_lm()
    if world > 1:
        model = DistributedDataParallel(model)
    torch.manual_seed(100 + rank)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5),
                      loss_fn=ShiftedTokenCrossEntropy(), shift_labels=True, accumulation_steps=4)
    history = trainer.fit(make_loader(token_dataset(LM_SAMPLES, length=6, seed=17), MICRO_BATCH, seed=SEED,
                                      rank=rank, world=world), epochs=EPOCHS)
    return {"params": [p.detach().clone() for p in _plain(model).parameters()],
            "losses": [s["loss"] for s in history.steps]}


def run_lm(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """The dropout GPT-2 alone (importing transformers takes seconds: its own, slow test)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        torch.save(train_dropout_lm(rank, world), Path(out_dir) / f"lm{rank}.pt")
    finally:
        dist.destroy_process_group()


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
        if resume is None:
            result["batchnorm"] = train_batchnorm(rank, world)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()

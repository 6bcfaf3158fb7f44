"""World-size invariance: distance between the weights trained on 1, 2, 3 (and 4) gloo ranks.

Every rank reads the whole dataset through ``make_loader(rank=..., world=...)`` and runs its
share of each global window (``accumulation_steps`` = 8 micro-batches over all ranks): padded
token sequences, micro-batches of 3 (the epoch's last one short), a short last window. The
figure is the largest max-abs distance (float64) of any world size's final weights from the
one-process run, and of a 2-rank checkpoint (written inside an epoch) resumed on 1 and on 3
ranks from the uninterrupted run; also the same distances in float32, relative to the total
update. Target: <= 1e-12 in float64.

    .venv/bin/python -m bench.trainer.world_invariance [--quick] [--out]
"""

from __future__ import annotations

import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from accumcore import Trainer, load_checkpoint
from accumcore.data import make_loader
from bench.harness import common as _common

TARGET = 1e-12
MICRO_BATCH = 3
WINDOW = 8
VOCAB, LENGTH = 16, 8


class _TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 24)
        self.head = nn.Linear(24, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


class _TokenLoss(nn.Module):
    reduction = "mean"

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)


def _data(samples: int) -> TensorDataset:
    """Sequences padded with -100 after a random valid length: item counts differ per row."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (samples, LENGTH), generator=g)
    targets = torch.randint(0, VOCAB, (samples, LENGTH), generator=g)
    valid = torch.randint(1, LENGTH + 1, (samples,), generator=g)
    targets[torch.arange(LENGTH)[None, :] >= valid[:, None]] = -100
    return TensorDataset(tokens, targets)


def _train(rank: int, world: int, config: dict[str, Any], dtype: torch.dtype,
           checkpoint_dir: Path | None = None, resume: Path | None = None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model: nn.Module = _TokenModel().to(dtype)
    if world > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.5)
    trainer = Trainer(model, optimizer, loss_fn=_TokenLoss(), accumulation_steps=WINDOW,
                      checkpoint_dir=checkpoint_dir,
                      checkpoint_every=config["checkpoint_step"] if checkpoint_dir else None)
    if resume is not None:
        trainer.load_state_dict(load_checkpoint(resume))
    trainer.fit(make_loader(_data(config["samples"]), MICRO_BATCH, seed=1, rank=rank, world=world),
                epochs=config["epochs"])
    plain = model.module if isinstance(model, DistributedDataParallel) else model
    return [p.detach().clone() for p in plain.parameters()]


def _rank(rank: int, world: int, folder: str, config: dict[str, Any], dtype_name: str,
          checkpoint_dir: str | None, resume: str | None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        torch.set_num_threads(1)
        params = _train(rank, world, config, getattr(torch, dtype_name),
                        Path(checkpoint_dir) if checkpoint_dir else None, Path(resume) if resume else None)
        if rank == 0:
            torch.save(params, Path(folder) / "params.pt")
    finally:
        dist.destroy_process_group()


def _ranks(world: int, folder: Path, config: dict[str, Any], dtype_name: str,
           checkpoint_dir: Path | None = None, resume: Path | None = None) -> list[torch.Tensor]:
    folder.mkdir()
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    mp.start_processes(_rank, args=(world, str(folder), config, dtype_name,
                                    str(checkpoint_dir) if checkpoint_dir else None,
                                    str(resume) if resume else None),
                       nprocs=world, join=True, start_method=method)
    params: list[torch.Tensor] = torch.load(folder / "params.pt")
    return params


def _distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a, b, strict=True))


def _relative(a: list[torch.Tensor], b: list[torch.Tensor], start: list[torch.Tensor]) -> float:
    """max |a - b| / max |b - start|: the distance against the size of the training's update."""
    update = max(float((q - s).abs().max()) for q, s in zip(b, start, strict=True))
    return _distance(a, b) / update


def _measure(config: dict[str, Any], dtype_name: str, folder: Path) -> dict[str, Any]:
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    start = [p.detach().clone() for p in _TokenModel().to(dtype).parameters()]
    one = _train(0, 1, config, dtype)
    checkpoints = folder / f"{dtype_name}-checkpoints"
    runs = {world: _ranks(world, folder / f"{dtype_name}-{world}", config, dtype_name,
                          checkpoint_dir=checkpoints if world == 2 else None)
            for world in config["worlds"]}
    resume_from = checkpoints / f"{config['checkpoint_step']}.pt"
    resumed = {1: _train(0, 1, config, dtype, resume=resume_from),
               3: _ranks(3, folder / f"{dtype_name}-resumed-3", config, dtype_name, resume=resume_from)}
    return {
        "world_vs_one_process": {str(w): _distance(p, one) for w, p in runs.items()},
        "resumed_vs_uninterrupted_2_ranks": {str(w): _distance(p, runs[2]) for w, p in resumed.items()},
        "relative_to_update": max(
            [_relative(p, one, start) for p in runs.values()] + [_relative(p, runs[2], start) for p in resumed.values()]
        ),
    }


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    config = {
        "samples": 41 if args.quick else 301,  # micro-batches of 3: the last holds 2 (41) / 1 (301)
        "epochs": 1 if args.quick else 2,
        "worlds": [2, 3] if args.quick else [2, 3, 4],
        "checkpoint_step": 1 if args.quick else 17,  # inside an epoch (13 windows per epoch at 301)
    }
    with tempfile.TemporaryDirectory() as folder:
        f64 = _measure(config, "float64", Path(folder))
        f32 = _measure(config, "float32", Path(folder))
    measured = max([*f64["world_vs_one_process"].values(), *f64["resumed_vs_uninterrupted_2_ranks"].values()])
    _common.emit("world_invariance", {
        "machine": {**_common.machine("cpu"), "clock": "wall", "torch_threads": 1},
        "figure": "max abs distance of final weights, 1 process vs 2/3/4 gloo ranks and a 2-rank "
                  "checkpoint resumed on 1 and 3 ranks, float64",
        "target": TARGET, "measured": measured, "verdict": _common.verdict(measured, TARGET, False),
        "float64": f64, "float32": f32,
        "workload": f"{config['samples']} padded token sequences, m={MICRO_BATCH}, {WINDOW} micro-batches "
                    "per step over all ranks, SGD with momentum",
        "config": config,
    }, args)


if __name__ == "__main__":
    main()

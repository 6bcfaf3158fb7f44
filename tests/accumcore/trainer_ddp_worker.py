"""One rank of the DDP test (run by torch.multiprocessing.spawn from test_trainer_ddp.py).

Each rank trains its own shard of padded token sequences, so the ranks' item counts differ
in every window; a comm hook counts gradient all-reduces.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from trainer_reference import TokenCrossEntropy, token_dataset, token_model

from accumcore import Trainer
from accumcore.data import make_loader

WORLD = 2
SAMPLES_PER_RANK = 10
MICRO_BATCH = 2
ACCUMULATION = 3  # 5 batches per rank and epoch: windows of 3 and 2 micro-batches
EPOCHS = 2


def shard(rank: int):
    dataset = token_dataset(SAMPLES_PER_RANK * WORLD, seed=11)
    tokens, targets = dataset.tensors
    part = slice(rank * SAMPLES_PER_RANK, (rank + 1) * SAMPLES_PER_RANK)
    return torch.utils.data.TensorDataset(tokens[part], targets[part])


def counting_allreduce(state: dict, bucket):
    state["count"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def run(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        model = DistributedDataParallel(copy.deepcopy(token_model(torch.float64)))
        state = {"count": 0}
        model.register_comm_hook(state, counting_allreduce)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=ACCUMULATION)
        history = trainer.fit(make_loader(shard(rank), MICRO_BATCH, shuffle=False), epochs=EPOCHS)
        torch.save(
            {"params": [p.detach() for p in model.module.parameters()], "allreduces": state["count"],
             "losses": [s["loss"] for s in history.steps], "items_per_step": [s["items_per_s"] * s["step_time_s"] for s in history.steps]},
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()

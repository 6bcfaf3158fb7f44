"""DDP: step time with no-sync inside the window / with a gradient all-reduce every micro-batch.

Two gloo processes on the CPU, each training its shard through accumcore's Trainer with
N=4, one thread each, timed on the wall clock whatever --clock says. "no_sync" is the Trainer as shipped (all-reduce only on the window's last micro-batch);
"sync_every" is the same run with the Trainer's `no_sync` helper replaced by a null context,
i.e. what a loop that forgets `model.no_sync()` does. Modes are interleaved per repeat.
Target: no_sync / sync_every <= 0.9 at N=4.

    .venv/bin/python -m bench.trainer.ddp_no_sync [--quick] [--out]
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from accumcore import window
from accumcore.device_data import DeviceBatches
from bench.harness import common as _common
from bench.harness import workloads as w

WORLD = 2
N_ACC = 4


def _rank(rank: int, init_file: str, out: str, config: dict[str, Any]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)  # two processes on a two-core machine
        # Always the wall clock: waiting for the other rank's all-reduce is part of a step,
        # and process CPU time would not see it.
        _common.set_clock("wall")
        torch.manual_seed(0)
        hidden = config["hidden"]
        model = DistributedDataParallel(w.mlp(784, hidden, 10))
        data = w.image_data(config["m"] * N_ACC * config["steps"], seed=rank)
        batches = DeviceBatches(*data.tensors, config["m"], seed=rank)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = nn.CrossEntropyLoss()
        shipped = window.distributed.no_sync

        def run(mode: str) -> float:
            window.distributed.no_sync = (  # type: ignore[attr-defined]
                shipped if mode == "no_sync" else (lambda model, skip: contextlib.nullcontext())
            )
            try:
                dist.barrier()
                seconds = _common.timed(lambda: w.run_trainer(model, optimizer, batches, N_ACC, loss_fn))
            finally:
                window.distributed.no_sync = shipped  # type: ignore[attr-defined]
            return seconds / config["steps"]

        runs = _common.interleaved({"no_sync": lambda: run("no_sync"), "sync_every": lambda: run("sync_every")},
                                   config["repeats"], config["warmup"])
        if rank == 0:
            Path(out).write_text(json.dumps(runs))
    finally:
        dist.destroy_process_group()


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    config = {
        "m": 2 if args.quick else 8,
        "hidden": 16 if args.quick else 1024,
        "steps": 1 if args.quick else 8,
        "repeats": args.repeats or (1 if args.quick else 5),
        "warmup": _common.warmups(args),
    }
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "runs.json")
        # fork where there is one: the ranks inherit the imported torch instead of paying for
        # a fresh interpreter each (this process has run no parallel op yet, so it is safe).
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        mp.start_processes(_rank, args=(str(Path(folder) / "init"), out, config), nprocs=WORLD,
                           join=True, start_method=method)
        runs = json.loads(Path(out).read_text())
    step_no_sync, step_sync = _common.median(runs["no_sync"]), _common.median(runs["sync_every"])
    ratio = _common.paired_ratio(runs["no_sync"], runs["sync_every"])
    params = sum(p.numel() for p in w.mlp(784, config["hidden"], 10).parameters())
    _common.emit("ddp_no_sync", {
        "machine": {**_common.machine("cpu"), "clock": "wall", "torch_threads": 1},
        "figure": "step time no-sync / sync every micro-batch, 2 gloo processes, N=4",
        "target": 0.9, "measured": ratio, "verdict": _common.verdict(ratio, 0.9, False),
        "step_s_no_sync": step_no_sync, "step_s_sync_every": step_sync,
        "workload": f"mlp 784-{config['hidden']}-{config['hidden']}-10 ({params} parameters), m={config['m']}",
        "config": config, "runs": runs,
    }, args)


if __name__ == "__main__":
    main()

"""FSDP: per-rank peak memory and step time, per gradient-sync mode, against DDP.

k gloo processes on the CPU (k = 2 and 4), each training a 16-layer MLP (512 wide, about
4.2 M parameters, AdamW) through accumcore's Trainer with N=4: DDP (replicas), FSDP with a
reduce-scatter after every micro-batch ("micro_batch") and FSDP with one per window
("window"). Memory: the rise of each rank's peak resident set (VmHWM, reset before the model
is built; glibc told to mmap large blocks so that freed memory leaves the set) over its
resident set before: parameters + gradients + optimizer states + what the passes allocate.
The FSDP model is built on the meta device and materialised after sharding, as a model too
big for one rank would be. Step time: median wall seconds of the steps after the first.
Target: FSDP micro_batch peak / DDP peak <= 1/k + 0.10 at each k.

    .venv/bin/python -m bench.trainer.fsdp_memory [--quick] [--out]
"""

from __future__ import annotations

import ctypes
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

import accumcore
from accumcore import Trainer
from bench.harness import common as _common

MODES = ("ddp", "micro_batch", "window")
N_ACC = 4
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def _model(width: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def _status(field: str) -> int:
    """A /proc/self/status memory field (kB) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _rank(rank: int, world: int, mode: str, init_file: str, out: str, config: dict[str, Any]) -> None:
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 1 << 16)  # freed tensors leave the RSS
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(rank)
        m = config["m"]
        # A warm-up run on a tiny model first: what the first fit loads and starts (modules
        # imported on first use, autograd's threads) is not the model's memory.
        _train(mode, 8, 1, [(torch.randn(m, 8), torch.randint(0, 10, (m,)))] * N_ACC)
        width = config["width"]
        batches = [(torch.randn(m, width), torch.randint(0, 10, (m,))) for _ in range(N_ACC * config["steps"])]
        dist.barrier()
        before = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        history = _train(mode, width, config["layers"], batches)
        peak = _status("VmHWM") - before
        peaks = [None] * world
        dist.all_gather_object(peaks, peak)
        if rank == 0:
            times = [s["step_time_s"] for s in history.steps[1:]]
            Path(out).write_text(json.dumps({"peak_bytes": max(peaks), "step_s": _common.median(times)}))
    finally:
        dist.destroy_process_group()


def _train(mode: str, width: int, layers: int, batches: list[Any]) -> Any:
    if mode == "ddp":
        model: nn.Module = DistributedDataParallel(_model(width, layers))
    else:
        with torch.device("meta"):
            model = _model(width, layers)
        accumcore.shard(model)
        model.to_empty(device="cpu")
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    trainer = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=N_ACC,
                      fsdp_sync="window" if mode == "window" else "micro_batch")
    return trainer.fit(batches, epochs=1)


def _run(world: int, mode: str, config: dict[str, Any]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "run.json")
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        mp.start_processes(_rank, args=(world, mode, str(Path(folder) / "init"), out, config), nprocs=world,
                           join=True, start_method=method)
        return json.loads(Path(out).read_text())


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    config = {
        "width": 64 if args.quick else 512,
        "layers": 2 if args.quick else 16,
        "m": 4,
        "steps": 2 if args.quick else 3,
        "repeats": args.repeats or 1,
        "worlds": [2] if args.quick else [2, 4],
    }
    rows: dict[str, Any] = {}
    for world in config["worlds"]:
        runs = {mode: [] for mode in MODES}
        for index in range(config["repeats"]):  # modes interleaved: A B C, C B A, ...
            for mode in MODES if index % 2 == 0 else reversed(MODES):
                runs[mode].append(_run(world, mode, config))
                print(f"k={world} {mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
        peak = {mode: _common.median([r["peak_bytes"] for r in runs[mode]]) for mode in MODES}
        step = {mode: _common.median([r["step_s"] for r in runs[mode]]) for mode in MODES}
        rows[str(world)] = {
            "peak_mb": {mode: peak[mode] / 2**20 for mode in MODES},
            "step_s": step,
            "peak_vs_ddp": {mode: peak[mode] / peak["ddp"] for mode in MODES[1:]},
            "step_vs_ddp": {mode: step[mode] / step["ddp"] for mode in MODES[1:]},
            "target": 1 / world + 0.10,
            "runs": runs,
        }
    worst = max(rows[k]["peak_vs_ddp"]["micro_batch"] - rows[k]["target"] for k in rows)
    params = sum(p.numel() for p in _model(config["width"], config["layers"]).parameters())
    _common.emit("fsdp_memory", {
        "machine": {**_common.machine("cpu"), "clock": "wall", "torch_threads": 1},
        "figure": "per-rank peak memory, FSDP (sync per micro-batch) / DDP, k gloo processes, N=4",
        "target": "1/k + 0.10", "measured": {k: rows[k]["peak_vs_ddp"]["micro_batch"] for k in rows},
        "verdict": "pass" if worst <= 0 else "miss",
        "workload": f"mlp {config['layers']}x{config['width']} ({params} parameters), AdamW, m={config['m']}",
        "config": config, "by_world": rows,
    }, args)


if __name__ == "__main__":
    main()

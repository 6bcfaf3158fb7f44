"""What the worker-level exactness tests share: the job's model in float64 as the job draws it,
each rank's micro-batches in the job's order, a `gpus: 2` job run on 2 gloo ranks (the
worker's own `build_run`, the model in float64 under DDP), and the largest difference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rank_processes import start_method
from torch.nn.parallel import DistributedDataParallel

from accumcore.data import make_loader
from services.catalog.build import build_model
from services.catalog.builders.datasets import DatasetBundle
from services.spec import JobSpec, parse_spec
from services.worker.build import build_data, build_run


def float64_start(spec: dict[str, Any]) -> tuple[JobSpec, DatasetBundle, torch.nn.Module]:
    """(parsed spec, dataset bundle, the job's initial model in float64)."""
    parsed = parse_spec(spec)
    bundle = build_data(parsed, None)
    torch.manual_seed(parsed.seed)
    model = build_model(parsed.model.name, bundle, **parsed.model.options).double()
    return parsed, bundle, model


def global_windows(parsed: JobSpec, bundle: DatasetBundle, micro: int, window: int,
                   collate: Callable[[list[Any]], Any] | None) -> list[list[Any]]:
    """The first epoch's global windows: the job's (seed, epoch) order of the whole training
    set in micro-batches, ``window`` (N x world) at a time, whatever the number of ranks."""
    loader = make_loader(bundle.train, micro, shuffle=True, seed=parsed.seed, collate_fn=collate)
    loader.batch_sampler.set_epoch(0)
    batches = list(loader)
    return [batches[w: w + window] for w in range(0, len(batches), window)]


def largest_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a, b, strict=True))


def _rank(rank: int, world: int, init_file: str, out: str, spec: dict[str, Any],
          count: Callable[[Any], int]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        run = build_run(parse_spec(spec), callbacks=[], checkpoint_dir=None, device="cpu", rank=rank, world=world,
                        wrap_model=lambda m: DistributedDataParallel(m.double()))
        items = sum(count(b) for b in run.train_loader)
        run.trainer.fit(run.train_loader, **{**run.fit_kwargs, "val_loader": None})
        torch.save({"params": [p.detach() for p in run.trainer.model.module.parameters()],
                    "steps": run.trainer.global_step, "items": items}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(spec: dict[str, Any], world: int, out: Path, count: Callable[[Any], int]) -> list[dict[str, Any]]:
    """Train `spec` on `world` gloo ranks (forked); per rank: its final parameters, optimizer
    steps, and the items of its shard by `count(batch)`."""
    import torch._dynamo  # noqa: F401  # imported before forking, as tests/accumcore/test_trainer_ddp.py does

    mp.start_processes(_rank, args=(world, str(out / "init"), str(out), spec, count), nprocs=world, join=True,
                       start_method=start_method())
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]

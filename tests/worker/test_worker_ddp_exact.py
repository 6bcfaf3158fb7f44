"""A ``gpus: 2`` job is the big batch of its data: uneven shards, no sample counted twice.

9 training samples on 2 ranks with m = 2, N = 2 (not divisible by k x m): the epoch's order
of all 9 samples is cut into 5 micro-batches (2, 2, 2, 2, 1) and global windows of
N x k = 4 of them; each rank runs its share of each window, every sample exactly once (no
padding by repetition). Rank 1 has no micro-batch in each epoch's second window (one
micro-batch): it contributes zero items and still joins the collectives. Two gloo processes
run ``build_run`` (the worker's own objects: model, loader order, optimizer, Trainer) with the
model in float64, and the result equals a single-process float64 big-batch step per global
window, the same windows a `gpus: 1, N: 4` job trains on.

The same ranks then train the model with dropout 0.3 in front of it (issue 41): the worker's
Trainer keys each micro-batch's masks by (spec seed, epoch, global micro-batch), so the
2-rank job ends where the `gpus: 1, N: 4` job does, and the two ranks never draw one mask
(before, every rank drew rank 0's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rank_processes import start_method
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from services.spec import parse_spec
from services.worker.build import build_data, build_run, make_train_loader, rank_shard

WORLD = 2
SPEC: dict[str, Any] = {
    "model": "mlp", "dataset": {"name": "fake", "size": 9, "val_size": 2, "image_size": 2, "num_classes": 3},
    "micro_batch_size": 2, "accumulation_steps": 2, "epochs": 2, "gpus": WORLD,
    "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.5},
}


class Float64(nn.Module):
    """Runs the job's model in float64 (the loader yields float32 images)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.double())


class DropoutFloat64(Float64):
    """Float64 with dropout 0.3 on its inputs, keeping every training forward's mask."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__(inner)
        self.dropout = nn.Dropout(0.3)
        self.masks: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.double() + 1.0  # no zero pixel: a zero after dropout is the mask's
        dropped = self.dropout(x)
        if self.training:
            self.masks.append((dropped == 0).clone())
        return self.inner(dropped)


def _dropout_fit(spec: dict[str, Any], rank: int = 0, world: int = 1) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Train the job with ``DropoutFloat64`` (DDP-wrapped on several ranks): weights, masks."""
    wrap = (lambda m: DistributedDataParallel(DropoutFloat64(m))) if world > 1 else DropoutFloat64
    run = build_run(parse_spec(spec), callbacks=[], checkpoint_dir=None, device="cpu", rank=rank, world=world,
                    wrap_model=wrap)
    run.trainer.fit(run.train_loader, **{**run.fit_kwargs, "val_loader": None})
    module = run.trainer.model.module if world > 1 else run.trainer.model
    return [p.detach() for p in module.inner.parameters()], module.masks


def _rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        run = build_run(parse_spec(SPEC), callbacks=[], checkpoint_dir=None, device="cpu", rank=rank, world=WORLD,
                        wrap_model=lambda m: DistributedDataParallel(Float64(m)))
        run.trainer.fit(run.train_loader, **{**run.fit_kwargs, "val_loader": None})
        dropout_params, masks = _dropout_fit(SPEC, rank, WORLD)
        torch.save({"params": [p.detach() for p in run.trainer.model.module.inner.parameters()],
                    "steps": run.trainer.global_step, "total": run.total_steps,
                    "dropout_params": dropout_params, "masks": masks}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _big_batch_reference() -> tuple[nn.Module, int]:
    """The same initial weights and the job's order of the whole set, one float64 big-batch
    step per global window of 4 micro-batches."""
    from accumcore.data import make_loader
    from services.catalog.build import build_model

    spec = parse_spec(SPEC)
    bundle = build_data(spec, None)
    torch.manual_seed(spec.seed)
    model = build_model(spec.model.name, bundle, **spec.model.options).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    loader = make_loader(bundle.train, 2, shuffle=True, seed=spec.seed)
    steps = 0
    for epoch in range(2):
        loader.batch_sampler.set_epoch(epoch)
        batches = list(loader)
        for w in range(0, len(batches), 2 * WORLD):
            window = batches[w: w + 2 * WORLD]
            x = torch.cat([x for x, _ in window]).double()
            y = torch.cat([y for _, y in window])
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
    return model, steps


def test_each_window_is_shared_by_the_ranks_every_sample_once() -> None:
    spec = parse_spec(SPEC)
    bundle = build_data(spec, None)
    loaders = [make_train_loader(spec, bundle.train, bundle, 2, "cpu", rank=r, world=WORLD) for r in range(WORLD)]
    for loader in loaders:
        loader.batch_sampler.set_window(2 * WORLD)
    shares = [list(loader.batch_sampler) for loader in loaders]
    assert [len(s) for s in shares] == [3, 2]  # window 1: 2 + 2, window 2: 1 + 0
    assert sorted(i for share in shares for batch in share for i in batch) == list(range(9))


def test_too_few_validation_samples_for_the_ranks_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="validation set has 2 samples, fewer than the job's 3 ranks"):
        rank_shard(list(range(2)), 0, 3)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict[str, Any]]:
    import torch._dynamo  # noqa: F401  # imported before forking, as tests/accumcore/test_trainer_ddp.py does

    tmp_path = tmp_path_factory.mktemp("ddp")
    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True,
                       start_method=start_method())
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def test_a_two_rank_job_equals_the_single_process_big_batch(results) -> None:
    reference, steps = _big_batch_reference()
    for result in results:
        assert result["steps"] == steps == result["total"] == 4  # 2 windows per epoch, as the spec predicts
        for p, q in zip(result["params"], reference.parameters(), strict=True):
            assert float((p - q.detach()).abs().max()) <= 1e-12


def test_a_two_rank_dropout_job_equals_the_one_gpu_job_and_its_ranks_share_no_mask(results) -> None:
    one_gpu, one_masks = _dropout_fit({**SPEC, "gpus": 1, "accumulation_steps": 2 * WORLD})
    for result in results:
        for p, q in zip(result["dropout_params"], one_gpu, strict=True):
            assert float((p - q).abs().max()) <= 1e-12
    keys = [(tuple(m.shape), m.numpy().tobytes()) for result in results for m in result["masks"]]
    assert len(keys) == len(one_masks) == 10 and len(set(keys)) == len(keys)  # 5 micro-batches x 2 epochs
    assert set(keys) == {(tuple(m.shape), m.numpy().tobytes()) for m in one_masks}

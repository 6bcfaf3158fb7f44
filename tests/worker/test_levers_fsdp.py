"""LoRA under FSDP (``strategy: "fsdp"`` with ``peft``) stays exact: 2 gloo ranks, float64.

The tiny GPT-2 of test_levers.py (built from its config, no download) with LoRA on ``c_attn``
and every block checkpointed, sharded with ``accumcore.shard`` as the worker's strategy does
(LoRA, then checkpointing, then ``fully_shard``); ``make_loader(rank=, world=)`` gives each
rank its part of every global window of 4 micro-batches (10 rows: windows of 8 and 2, the last
one on rank 0 alone). Two epochs: the adapters end where the one-process big batch does
(<= 1e-12; 2.2e-19 here), the frozen base is bitwise as built on both ranks, and a run resumed
from the sharded checkpoint of the first epoch (DCP: every rank's shards, the frozen base's
too) into a model built afresh ends bitwise where the uninterrupted one does. Then the same
through the worker (run_job, 2 CPU ranks): shards stored, consolidated, resumed elsewhere, and
``peft.merge``'s model gathered from the shards equal to the one-process job's (float32: the
adapted weights 7.5e-9 apart, the rest bitwise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rank_processes import start_method

from accumcore import Trainer, checkpoint_activations, load_checkpoint, shard
from accumcore.data import make_loader
from accumcore.frozen import trainable
from accumcore.schedule import AccumulationSchedule
from accumcore.sharding import is_sharded
from tests.accumcore.trainer_reference import big_batch_training
from tests.worker.test_levers import ShiftedTokenLoss, _data, _lora_gpt2, _loss_sum

WORLD, MICRO, WINDOW, EPOCHS = 2, 2, 4, 2  # WINDOW: micro-batches per step, both ranks together


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (a collective for the sharded ones), by its plain name."""
    return {name.replace("_checkpoint_wrapped_module.", ""):
            (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


def _trainer(model: torch.nn.Module, **options: Any) -> Trainer:
    optimizer = torch.optim.SGD(trainable(model), lr=0.1, momentum=0.5)
    return Trainer(model, optimizer, loss_fn=ShiftedTokenLoss(), accumulation_steps=WINDOW, shift_labels=True,
                   seed=3, checkpoint_frozen=False, **options)  # as build_run makes a LoRA job's


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        loader = lambda: make_loader(_data(), MICRO, seed=5, rank=rank, world=world)  # noqa: E731
        model = shard(checkpoint_activations(_lora_gpt2()))
        assert is_sharded(model) and any(hasattr(p, "full_tensor") for p in model.parameters())
        built = _full(model)
        trainer = _trainer(model)
        trainer.fit(loader(), epochs=EPOCHS)
        # The first epoch again, checkpointed (DCP: each rank its shards), then resumed into a
        # model built afresh.
        first = shard(checkpoint_activations(_lora_gpt2()))
        _trainer(first, checkpoint_dir=Path(out) / "checkpoints", checkpoint_every=1).fit(loader(), epochs=1)
        resumed = shard(checkpoint_activations(_lora_gpt2()))
        again = _trainer(resumed)
        again.load_state_dict(load_checkpoint(Path(out) / "checkpoints" / "2", model=resumed,
                                              optimizer=again.optimizer))
        again.fit(loader(), epochs=EPOCHS)
        torch.save({"built": built, "trained": _full(model), "steps": trainer.global_step,
                    "resumed": _full(resumed)}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_lora_on_sharded_ranks_steps_the_adapters_as_the_big_batch_and_leaves_the_base(tmp_path: Path) -> None:
    import torch._dynamo  # noqa: F401  (imported before forking, as test_trainer_ddp.py does)

    mp.start_processes(_rank, args=(WORLD, str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True,
                       start_method=start_method())
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    model = _lora_gpt2()
    reference, _ = big_batch_training(model, make_loader(_data(), MICRO, seed=5), _loss_sum,
                                      AccumulationSchedule(WINDOW), epochs=EPOCHS)
    want = {name: p.detach() for name, p in reference.named_parameters()}
    adapters = [name for name, p in model.named_parameters() if p.requires_grad]
    assert adapters and all("lora_" in name for name in adapters)
    for got in ranks:
        assert got["steps"] == 2 * EPOCHS  # windows of 8 and 2 rows
        assert sorted(got["trained"]) == sorted(want)
        worst = max(float((got["trained"][n] - want[n]).abs().max()) for n in adapters)
        assert worst <= 1e-12, worst
        assert max(float(got["trained"][n].abs().max()) for n in adapters if "lora_B" in n) > 0  # trained
        frozen = [n for n in want if n not in adapters]
        assert all(torch.equal(got["trained"][n], got["built"][n]) for n in frozen)
        assert all(torch.equal(got["built"][n], dict(model.named_parameters())[n].detach()) for n in frozen)
        assert all(torch.equal(got["resumed"][n], got["trained"][n]) for n in want)  # resumed bitwise


def _merged(settings: Any, job_id: str, folder: Path) -> dict[str, torch.Tensor]:
    """The job's merged.tar from the store, unpacked and loaded with ``from_pretrained``."""
    import tarfile

    from transformers import GPT2LMHeadModel

    from services.artifacts import merged_key, open_store

    open_store(settings.artifacts_url).get(merged_key(job_id), folder / "merged.tar")
    with tarfile.open(folder / "merged.tar") as tar:
        tar.extractall(folder / "download", filter="data")
    loaded = GPT2LMHeadModel.from_pretrained(folder / "download" / "merged")
    return {name: value.detach() for name, value in loaded.state_dict().items()}


@pytest.mark.slow
def test_a_lora_fsdp_job_through_the_worker_stores_its_shards_merges_and_resumes_on_another_node(
    settings: Any, make_job: Any, tmp_path: Path,
) -> None:
    """run_job on a gpus: 2, strategy fsdp job with LoRA, checkpointing and merge (2 CPU
    ranks): it succeeds, its consolidated checkpoint (what a download serves) holds the
    adapters and the base by name, its merged model (gathered from the shards at the end)
    loads with ``from_pretrained`` with no LoRA key and equals the same job's in one process
    (window 4 = 2 ranks x 2), and a resume on another node's cache loads the shards and ends."""
    from services.artifacts import consolidated_key, manifest_key
    from services.jobdb import jobs
    from services.jobdb.sessions import session_factory
    from services.worker.runner import run_job

    spec = {
        "model": {"name": "hf:gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 128,
                  "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
        "dataset": "text", "micro_batch_size": 2, "accumulation_steps": 2, "max_steps": 2, "gpus": 2,
        "strategy": "fsdp", "checkpoint_every": 1, "optimizer": {"name": "sgd", "lr": 0.5},
        "activation_checkpointing": True,
        "peft": {"method": "lora", "r": 2, "target_modules": ["c_attn"], "merge": True},
    }
    job_id = make_job(spec)
    assert run_job(settings, job_id, "node-a") == "succeeded"
    full = torch.load(settings.artifacts_path / consolidated_key(manifest_key(job_id, 2)), weights_only=True)
    assert any("lora_A" in key for key in full["model"]) and any("c_attn.base_layer" in key for key in full["model"])
    merged = _merged(settings, job_id, tmp_path / "sharded")
    one = make_job({**{k: v for k, v in spec.items() if k != "strategy"}, "gpus": 1, "accumulation_steps": 4})
    assert run_job(settings, one, "node-a") == "succeeded"
    want = _merged(settings, one, tmp_path / "one")
    assert sorted(merged) == sorted(want) and not any("lora" in key for key in merged)
    # Only the adapted c_attn weights differ, by the float32 round-off of the gradient sums (2
    # ranks' halves reduce-scattered against one process's sum: 7.5e-9 here, one ulp at 0.06-0.12,
    # the weights' size); 1e-6 allows ~8 ulps at |w| <= 1. The rest is the frozen base, bitwise.
    adapted = [key for key in want if key.endswith("c_attn.weight")]
    assert all(torch.equal(merged[key], want[key]) for key in want if key not in adapted)
    worst = max(float((merged[key] - want[key]).abs().max()) for key in adapted)
    moved = max(float((want[key] - full["model"]["base_model.model." + key.replace("c_attn.", "c_attn.base_layer.")])
                      .abs().max()) for key in adapted)
    print(f"merged, sharded vs one process: {worst:.3g}; merged vs base c_attn: {moved:.3g}")
    assert moved > 1e-3  # the adapters moved the merged weights (4.6e-2 here), far past the round-off
    assert worst <= 1e-6, worst
    with session_factory(settings).begin() as session:  # resumable from step 2, as POST /resume makes it
        job = jobs.load_job(session, job_id)
        assert job is not None
        job.status = "failed"
        jobs.request_resume(session, job)
    other = settings.model_copy(update={"cache_dir": tmp_path / "node-b-cache"})
    assert run_job(other, job_id, "node-b") == "succeeded"

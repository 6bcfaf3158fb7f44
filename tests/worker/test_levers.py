"""LoRA through the worker's levers (``services.worker.levers``) stays exact.

A tiny GPT-2 built from its config (float64, no dropout, no download) with LoRA adapters on
``c_attn``: windows of 3 micro-batches (the last one short, rows padded) step the adapters as
the big batch does (<= 1e-12) while the frozen base stays bitwise as built; checkpoints hold
the adapters only, and a run resumed from one into a freshly built model ends bitwise where
the uninterrupted run does; the merged model saved for download loads with
``from_pretrained`` and computes what base + adapters compute.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from accumcore import Trainer, checkpoint_activations
from accumcore.activation_checkpointing import checkpointed_blocks
from accumcore.data import make_loader
from accumcore.frozen import trainable
from accumcore.schedule import AccumulationSchedule
from services.spec.levers import PeftOptions
from services.worker import levers
from tests.accumcore.trainer_reference import big_batch_training

LORA = PeftOptions(r=4, alpha=8, target_modules=["c_attn"])


class ShiftedTokenLoss(nn.Module):
    reduction = "mean"

    def forward(self, outputs, labels: torch.Tensor) -> torch.Tensor:
        logits = outputs.logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def _loss_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    logits = model(x).logits[:, :-1]
    targets = y[:, 1:].reshape(-1)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, ignore_index=-100,
                           reduction="sum"), int((targets != -100).sum())


def _lora_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(4)
    config = GPT2Config(vocab_size=13, n_positions=8, n_embd=8, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return levers.add_lora(GPT2LMHeadModel(config).double(), LORA)


def _data() -> TensorDataset:
    torch.manual_seed(1)
    tokens = torch.randint(0, 13, (10, 8))
    labels = tokens.clone()
    labels[::3, 5:] = -100
    return TensorDataset(tokens, labels)


def _trainer(model: nn.Module, **options) -> Trainer:
    optimizer = torch.optim.SGD(trainable(model), lr=0.1, momentum=0.5)
    return Trainer(model, optimizer, loss_fn=ShiftedTokenLoss(), accumulation_steps=3, shift_labels=True,
                   seed=3, **options)


def _frozen(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def test_lora_windows_step_the_adapters_as_the_big_batch_and_leave_the_base_bitwise() -> None:
    model = _lora_gpt2()
    base = _frozen(model)
    adapters = [n for n, p in model.named_parameters() if p.requires_grad]
    assert adapters and all("lora_" in n for n in adapters)
    loader = make_loader(_data(), 2, seed=5)
    reference, _ = big_batch_training(model, loader, _loss_sum, AccumulationSchedule(3), epochs=2)
    _trainer(model).fit(loader, epochs=2)
    ours, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
    worst = max(float((ours[n] - theirs[n]).detach().abs().max()) for n in adapters)
    assert worst <= 1e-12, worst
    assert max(float(ours[n].abs().max()) for n in adapters if "lora_B" in n) > 0  # they trained
    assert all(torch.equal(value, ours[name]) for name, value in base.items())


def test_a_lora_run_checkpoints_its_adapters_and_resumes_bitwise(tmp_path: Path) -> None:
    data = _data()
    whole = _lora_gpt2()
    _trainer(whole).fit(make_loader(data, 2, seed=5), epochs=2)

    first = _lora_gpt2()
    _trainer(first, checkpoint_dir=tmp_path, checkpoint_every=1, checkpoint_frozen=False).fit(
        make_loader(data, 2, seed=5), epochs=1)
    state = torch.load(tmp_path / "2.pt", weights_only=True)
    assert state["model"] and all("lora_" in key for key in state["model"])  # the base is left out
    resumed = _lora_gpt2()
    trainer = _trainer(resumed, checkpoint_frozen=False)
    trainer.load_state_dict(state)
    trainer.fit(make_loader(data, 2, seed=5), epochs=2)
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(),
                                                 strict=True))


def test_the_stored_merged_model_loads_with_from_pretrained(tmp_path: Path) -> None:
    """What ``peft.merge`` stores at the job's end (a tar in a real local store), unpacked."""
    import tarfile

    from transformers import GPT2LMHeadModel

    from services.artifacts import open_store
    from services.artifacts.cache import NodeCache
    from services.worker.checkpoints.uploads import CheckpointUploads

    model = _lora_gpt2()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_()  # adapters that change the output
    checkpoint_activations(model)  # a checkpointed job's blocks are unwrapped for the download
    store = open_store(f"file://{tmp_path / 'store'}")
    uploads = CheckpointUploads(store, NodeCache(tmp_path / "cache", 1 << 30), "job1", retry_for_s=1.0)
    key = levers.store_merged(model, uploads, "job1")
    store.get(key, tmp_path / "merged.tar")
    with tarfile.open(tmp_path / "merged.tar") as tar:
        tar.extractall(tmp_path / "download", filter="data")
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "download" / "merged", dtype=torch.float64).eval()
    tokens = _data().tensors[0][:3]
    expected = copy.deepcopy(model).eval()(tokens).logits
    assert torch.allclose(loaded(tokens).logits, expected, atol=1e-10)
    assert not any("lora" in name for name in loaded.state_dict())


def test_a_job_spec_with_both_levers_builds_and_trains_adapters_only_on_checkpointed_blocks(tmp_path: Path) -> None:
    """build_run: hf:gpt2 on the shipped text with activation checkpointing and LoRA; two steps
    leave the base bitwise, the events say what was turned on, the checkpoint holds adapters."""
    from services.spec import parse_spec
    from services.worker.build import build_run

    spec = parse_spec({
        "model": {"name": "hf:gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 128},
        "dataset": "text", "micro_batch_size": 2, "accumulation_steps": 2, "max_steps": 2, "gpus": 0,
        "optimizer": {"name": "adamw", "lr": 1e-2}, "activation_checkpointing": True,
        "peft": {"method": "lora", "r": 2, "alpha": 4, "target_modules": ["c_attn"]},
    })
    run = build_run(spec, callbacks=[], checkpoint_dir=tmp_path, device="cpu")
    module = run.trainer.model
    base = _frozen(module)
    assert {kind for kind, _, _ in run.notes} >= {"activation_checkpointing", "lora"}
    assert [p for group in run.trainer.optimizer.param_groups for p in group["params"]] == trainable(module)
    run.trainer.fit(run.train_loader, **run.fit_kwargs)
    assert all(torch.equal(value, dict(module.named_parameters())[name]) for name, value in base.items())
    state = torch.load(tmp_path / "2.pt", weights_only=True)
    assert all("lora_" in key for key in state["model"])


def test_a_sequence_classifier_trains_its_adapters_and_its_remade_head() -> None:
    """The catalog's Logits around an hf: classifier: LoRA goes inside (peft's default targets
    for the model type), the head it re-made for the data's classes is trained in full, and
    checkpointing finds the blocks through both wrappers."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from services.catalog.builders.own_models import Logits

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=13, n_positions=8, n_embd=8, n_layer=2, n_head=2, num_labels=3, pad_token_id=0)
    model = levers.add_lora(Logits(GPT2ForSequenceClassification(config)), PeftOptions(r=2))
    assert checkpointed_blocks(checkpoint_activations(model)) == 2
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trained) and any(".score." in n for n in trained)
    assert all("lora_" in n or ".score." in n for n in trained)
    logits = model(input_ids=torch.randint(1, 13, (4, 8)))
    F.cross_entropy(logits, torch.tensor([0, 1, 2, 0])).backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if n in trained)


def test_a_lora_job_through_the_worker_stores_adapters_and_the_merged_model(
    settings: Any, make_job: Any, tmp_path: Path,
) -> None:
    """run_job on a LoRA + checkpointing job with merge: its checkpoints hold the adapters
    only, the merged model is in the store, and a resume on another node loads them."""
    import tarfile

    from transformers import GPT2LMHeadModel

    from services.artifacts import merged_key, open_store
    from services.jobdb import jobs
    from services.jobdb.sessions import session_factory
    from services.worker.runner import run_job

    job_id = make_job({
        "model": {"name": "hf:gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 128},
        "dataset": "text", "micro_batch_size": 2, "accumulation_steps": 2, "max_steps": 2, "gpus": 0,
        "checkpoint_every": 1, "optimizer": {"name": "adamw", "lr": 1e-2}, "activation_checkpointing": True,
        "peft": {"method": "lora", "r": 2, "target_modules": ["c_attn"], "merge": True},
    })
    assert run_job(settings, job_id, "node-a") == "succeeded"
    store = open_store(settings.artifacts_url)
    store.get(f"{job_id}/2.pt", tmp_path / "2.pt")
    assert all("lora_" in key for key in torch.load(tmp_path / "2.pt", weights_only=True)["model"])
    store.get(merged_key(job_id), tmp_path / "merged.tar")
    with tarfile.open(tmp_path / "merged.tar") as tar:
        tar.extractall(tmp_path / "download", filter="data")
    assert GPT2LMHeadModel.from_pretrained(tmp_path / "download" / "merged").config.n_layer == 2
    with session_factory(settings).begin() as session:  # resumable from step 2, as POST /resume makes it
        job = jobs.load_job(session, job_id)
        job.status = "failed"
        jobs.request_resume(session, job)
    other = settings.model_copy(update={"cache_dir": tmp_path / "node-b-cache"})
    assert run_job(other, job_id, "node-b") == "succeeded"

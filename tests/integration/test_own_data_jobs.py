"""Your own model and data through a real worker (PostgreSQL + Redis): an image folder trains
timm:resnet18, small_cnn and hf:vit above chance, jsonl and parquet text train hf:gpt2 (bytes
and a trained tokenizer) with falling validation loss, labelled text trains hf:bert, hf:gpt2
and a saved hf: directory as sequence classifiers above chance, the example plugin trains, a
warm start loads its source job's checkpoint (on each of 2 gloo ranks too), and bad names, columns and init_from jobs fail
before any step saying what is allowed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.jobdb import events, jobs, metrics, tokens
from services.spec import parse_spec
from tests.own_data_files import (
    CLASS_WORDS,
    CLASSES,
    ensure_example_plugin,
    make_image_folder,
    train_tokenizer,
    write_labelled_text,
    write_text,
)
from tests.worker_stack import Stack, make_stack

GPT2 = {"name": "hf:gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64}
BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}
VIT = {"name": "hf:vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
       "intermediate_size": 64, "patch_size": 8}


def save_bert(directory: Path) -> None:
    """A tiny BERT sequence classifier (5 labels, bytes + padding id) saved with save_pretrained:
    what `hf:<directory>` loads, its head re-made for the data's 3 classes."""
    import transformers

    config = transformers.BertConfig(vocab_size=257, pad_token_id=256, num_labels=5, **BERT)
    transformers.BertForSequenceClassification(config).save_pretrained(directory)


@pytest.fixture(scope="module")
def own(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ensure_example_plugin()  # before the worker starts, so it sees the entry points
    stack = make_stack("postgres_redis", tmp_path_factory.mktemp("own"), request)
    data = stack.settings.home / "data"
    make_image_folder(data / "colours", per_class=12, size=16)
    write_text(data / "text", "jsonl", repeat=4)
    write_text(data / "text", "parquet", repeat=4)
    train_tokenizer(data / "text" / "tok")
    write_labelled_text(data / "labelled", "jsonl", rows=90)
    write_labelled_text(data / "labelled", "parquet", rows=90, seed=1)
    save_bert(data / "models" / "bert")
    stack.start_worker(args=("--cpu-ranks", "2"))  # the two-rank warm start runs on CPU ranks
    try:
        yield stack
    finally:
        stack.stop_workers()


def values(stack: Stack, job_id: str, name: str) -> list[float]:
    with stack.sessions() as session:
        rows, _ = metrics.read_metrics(session, job_id, name=name, limit=10_000)
    return [row.value for row in rows]


def event(stack: Stack, job_id: str, kind: str) -> Any:
    with stack.sessions() as session:
        return next((e for e in events.list_events(session, job_id, limit=1000) if e.kind == kind), None)


def images(stack: Stack) -> dict[str, Any]:
    return {"name": "imagefolder", "data_root": str(stack.settings.home / "data" / "colours"),
            "image_size": 32, "val_fraction": 0.25}


def text(stack: Stack, kind: str, tokenizer: str) -> dict[str, Any]:
    return {"name": "files", "data_root": str(stack.settings.home / "data" / "text"), "data_files": f"text.{kind}",
            "columns": {"text": "body"}, "tokenizer": tokenizer, "max_len": 32}


@pytest.mark.parametrize("model", ["timm:resnet18", "small_cnn"])
@pytest.mark.slow
def test_an_image_folder_trains_above_chance(own: Stack, model: str) -> None:
    job_id = own.create(model=model, dataset=images(own), micro_batch_size=9, accumulation_steps=1,
                        max_steps=None, epochs=6, optimizer={"name": "adamw", "lr": 0.003}, checkpoint_every=100)
    job = own.wait(job_id, timeout=240)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    assert job.progress["total_optimizer_steps"] == 6 * 3  # 27 training images, 9 per step
    accuracy = values(own, job_id, "val_accuracy")
    assert accuracy[-1] > 2 / len(CLASSES), accuracy  # chance is 1/3


@pytest.mark.parametrize(("kind", "tokenizer"), [("jsonl", "bytes"), ("parquet", "tok")])
def test_text_files_train_a_tiny_gpt2(own: Stack, kind: str, tokenizer: str) -> None:
    job_id = own.create(model=GPT2, dataset=text(own, kind, tokenizer), micro_batch_size=4, accumulation_steps=2,
                        max_steps=24, eval_every=8, optimizer={"name": "adamw", "lr": 0.003}, checkpoint_every=100)
    job = own.wait(job_id, timeout=240)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    losses = values(own, job_id, "val_loss")
    assert len(losses) >= 3 and losses[-1] < losses[0], losses  # every 8 steps and each epoch end


@pytest.mark.slow
def test_an_image_folder_trains_a_hugging_face_vit_above_chance(own: Stack) -> None:
    job_id = own.create(model=VIT, dataset=images(own), micro_batch_size=9, accumulation_steps=1,
                        max_steps=None, epochs=6, optimizer={"name": "adamw", "lr": 0.003}, checkpoint_every=100)
    job = own.wait(job_id, timeout=240)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    accuracy = values(own, job_id, "val_accuracy")
    assert accuracy[-1] > 2 / len(CLASSES), accuracy  # chance is 1/3


@pytest.mark.slow
@pytest.mark.parametrize(("model", "kind"), [
    ({"name": "hf:bert", **BERT}, "jsonl"),
    (GPT2, "parquet"),
    ("hf:<home>/data/models/bert", "jsonl"),
])
def test_labelled_text_trains_a_sequence_classifier_above_chance(own: Stack, model: Any, kind: str) -> None:
    if model == "hf:<home>/data/models/bert":
        model = f"hf:{own.settings.home / 'data' / 'models' / 'bert'}"
    dataset = {"name": "files", "data_root": str(own.settings.home / "data" / "labelled"),
               "data_files": f"labelled.{kind}", "columns": {"text": "body", "label": "y"}, "tokenizer": "bytes",
               "max_len": 64, "val_fraction": 0.2}
    job_id = own.create(model=model, dataset=dataset, micro_batch_size=8, accumulation_steps=2, max_steps=None,
                        epochs=4, optimizer={"name": "adamw", "lr": 0.003}, checkpoint_every=100)
    job = own.wait(job_id, timeout=240)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    assert job.progress["total_optimizer_steps"] == 4 * 5  # 72 training rows, 16 per step
    accuracy = values(own, job_id, "val_accuracy")
    assert accuracy[-1] > 2 / len(CLASS_WORDS), accuracy  # chance is 1/3


def test_the_example_plugin_trains(own: Stack) -> None:
    job_id = own.create(model={"name": "example_mlp", "hidden": 16}, dataset={"name": "example_blobs", "size": 96},
                        micro_batch_size=8, accumulation_steps=2, max_steps=12, eval_every=12,
                        optimizer={"name": "adamw", "lr": 0.01})
    job = own.wait(job_id, timeout=120)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    assert values(own, job_id, "val_accuracy")[-1] > 0.6


def test_a_warm_start_loads_its_source_job(own: Stack) -> None:
    source = own.create(model="small_cnn", dataset=images(own), micro_batch_size=9, accumulation_steps=1,
                        max_steps=3, optimizer={"name": "sgd", "lr": 0.05})
    assert own.wait(source, timeout=120).status == "succeeded"
    weights = own.final_weights(source)
    job_id = own.create(model="small_cnn", dataset=images(own), micro_batch_size=9, accumulation_steps=1,
                        max_steps=1, optimizer={"name": "sgd", "lr": 0.05}, init_from={"job": source})
    job = own.wait(job_id, timeout=120)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    warm = event(own, job_id, "warm_start")
    assert warm is not None and warm.data["loaded"] == len(weights) and warm.data["path"].endswith("/3.pt")
    kinds = own.event_kinds(job_id)
    assert kinds.index("warm_start") < kinds.index("checkpoint")  # before the first step's results


@pytest.mark.slow
def test_a_two_rank_warm_start_loads_the_checkpoint_on_each_rank(own: Stack) -> None:
    from services.worker.warm_start import state_sha256

    common = {"model": "small_cnn", "dataset": images(own), "micro_batch_size": 9, "accumulation_steps": 1,
              "optimizer": {"name": "sgd", "lr": 0.05}}
    source = own.create(**common, max_steps=2)
    assert own.wait(source, timeout=120).status == "succeeded"
    expected = state_sha256(own.final_weights(source))
    job_id = own.create(**common, max_steps=1, gpus=2, init_from={"job": source})
    job = own.wait(job_id, timeout=180)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    warm = event(own, job_id, "warm_start")
    assert warm is not None and warm.data["weights_sha256"] == [expected, expected]  # rank 0's and rank 1's
    assert f"weights sha256 {expected[:16]} on all 2 ranks" in warm.message


def fails_before_any_step(stack: Stack, job_id: str) -> str:
    job = stack.wait(job_id, timeout=120)
    assert job.status == "failed" and job.progress["optimizer_step"] == 0, (job.status, job.error)
    assert values(stack, job_id, "loss") == []
    return str(job.error["message"])


def test_bad_names_and_columns_fail_at_start_naming_what_would_work(own: Stack) -> None:
    unknown = own.create(model="timm:resnet181", dataset=images(own))
    assert "timm has no model 'resnet181'" in fails_before_any_step(own, unknown)
    assert "close names: " in fails_before_any_step(own, unknown)
    column = own.create(model=GPT2, dataset={**text(own, "jsonl", "bytes"), "columns": {"text": "content"}})
    assert "column(s) content not in the data; its columns: body, id" in fails_before_any_step(own, column)


def test_another_owners_job_is_refused_by_the_worker_too(own: Stack) -> None:
    with own.sessions.begin() as session:
        other, _ = tokens.create_owner_with_token(session, f"other-{uuid.uuid4().hex[:6]}")
        theirs, _ = jobs.create_job(session, owner=other, spec=parse_spec({"model": "mlp", "dataset": "digits",
                                    "micro_batch_size": 4, "accumulation_steps": 1, "max_steps": 1,
                                    "optimizer": {"name": "sgd", "lr": 0.1}}).normalised(), queue="nowhere",
                                    max_restarts=0, total_optimizer_steps=1)
        theirs_id = theirs.id
    job_id = own.create(init_from={"job": theirs_id})  # stored directly: the API would refuse it
    message = fails_before_any_step(own, job_id)
    assert f"init_from.job {theirs_id!r}: no such job of yours" in message and "other-" not in message

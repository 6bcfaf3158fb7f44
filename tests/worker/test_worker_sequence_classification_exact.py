"""A sequence-classification job (`hf:bert`, `hf:gpt2` on labelled jsonl text) updates exactly
as the big batch.

Items are examples: one per sequence, whatever its length. 13 training rows of 1 to 6 words,
padded per micro-batch with the data's padding id (a new id after the byte vocabulary, which
GPT-2's classifier needs to find each row's last token), m = 2 and N = 3: windows of 3, 3 and
a short 1 micro-batch. In float64 on the CPU the worker's run (`build_run`: the model, the
padded batches with their attention mask, the loss, the Trainer) equals one step per window
on the window's rows padded as ONE batch, within 1e-12, on one process and on 2 gloo ranks
whose shards hold different numbers of examples; weighing the rows by their tokens instead
moves it off by far more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from accumcore import Trainer
from accumcore.data import make_loader
from services.catalog.build import build_loss
from services.catalog.builders.own_data import label_collate
from services.spec import parse_spec
from services.worker.build import build_run
from tests.own_data_files import write_labelled_text
from tests.worker.exact_runs import float64_start, global_windows, largest_difference, run_ranks

WORLD = 2
M, N, LR = 2, 3, 0.5
MODELS = {
    "hf:bert": {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32,
                "max_position_embeddings": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "hf:gpt2": {"n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 64,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}


def spec_for(root: Path, model: str, gpus: int) -> dict[str, Any]:
    return {
        "model": {"name": model, **MODELS[model]}, "micro_batch_size": M, "accumulation_steps": N, "epochs": 1,
        "gpus": gpus,
        "dataset": {"name": "files", "data_root": str(root), "data_files": "labelled.jsonl",
                    "columns": {"text": "body", "label": "y"}, "tokenizer": "bytes", "max_len": 64},
        "optimizer": {"name": "sgd", "lr": LR},
    }


def reference(spec: dict[str, Any], world: int) -> tuple[list[torch.Tensor], int]:
    """Initial weights as the job draws them; per window, every rank's rows of that window
    padded as one batch, the mean cross-entropy over its examples, one SGD step."""
    parsed, bundle, model = float64_start(spec)
    assert bundle.info.pad_token_id is not None
    big_batch = label_collate(bundle.info.pad_token_id)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    windows = global_windows(parsed, bundle, M, N * world, bundle.collate_fn)
    for batches in windows:
        rows = [(ids[mask.bool()], int(label)) for b in batches
                for ids, mask, label in zip(b["inputs"]["input_ids"], b["inputs"]["attention_mask"], b["targets"],
                                            strict=True)]
        batch = big_batch(rows)
        loss = torch.nn.functional.cross_entropy(model(**batch["inputs"]), batch["targets"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach() for p in model.parameters()], len(windows)


def tokens(inputs: Any, targets: Any) -> int:
    return int(inputs["attention_mask"].sum())


def direct_run(spec: dict[str, Any], count_items: Any) -> list[torch.Tensor]:
    parsed, bundle, model = float64_start(spec)
    loader = make_loader(bundle.train, M, shuffle=True, seed=parsed.seed, collate_fn=bundle.collate_fn)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=LR), loss_fn=build_loss(bundle, model),
                      accumulation_steps=N, count_items=count_items)
    trainer.fit(loader, epochs=1)
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("model", list(MODELS))
def test_the_window_update_is_the_big_batch_and_token_weights_are_not(tmp_path: Path, model: str) -> None:
    torch.set_num_threads(1)
    write_labelled_text(tmp_path, "jsonl", rows=14)
    spec = spec_for(tmp_path, model, gpus=0)
    run = build_run(parse_spec(spec), callbacks=[], checkpoint_dir=None, device="cpu",
                    wrap_model=lambda m: m.double())
    assert run.trainer.shift_labels is False
    assert type(run.trainer.model.inner).__name__.endswith("ForSequenceClassification")
    history = run.trainer.fit(run.train_loader, **{**run.fit_kwargs, "val_loader": None})
    expected, windows = reference(spec, 1)
    assert windows == len(history.steps) == run.total_steps == 3  # 7 micro-batches: 3, 3, 1
    assert largest_difference([p.detach() for p in run.trainer.model.parameters()], expected) <= 1e-12
    assert largest_difference(direct_run(spec, None), expected) <= 1e-12
    # Weighing each row by its tokens (as if this were language modelling) is far off.
    assert largest_difference(direct_run(spec, tokens), expected) > 1e-6


def examples(batch: Any) -> int:
    return int(batch["targets"].numel())


@pytest.mark.parametrize("model", list(MODELS))
def test_two_ranks_with_different_example_counts_equal_the_big_batch(tmp_path: Path, model: str) -> None:
    write_labelled_text(tmp_path / "data", "jsonl", rows=14)
    spec = spec_for(tmp_path / "data", model, WORLD)
    results = run_ranks(spec, WORLD, tmp_path, examples)
    assert [r["items"] for r in results] == [7, 6]
    expected, windows = reference(spec, WORLD)
    for result in results:
        assert result["steps"] == windows == 2  # rank 0: 4 micro-batches, rank 1: 3
        assert largest_difference(result["params"], expected) <= 1e-12

"""A causal-LM job (`hf:gpt2` on padded jsonl text) updates exactly as the big batch.

Items are the labels a causal LM scores: `labels[..., 1:]` that are not -100, summed over the
window and the ranks (transformers #46204 counted the unshifted first label too). 13 training
rows of different lengths, padded per micro-batch, m = 2 and N = 3: windows of 3, 3 and a short
1 micro-batch. In float64 on the CPU the worker's run (`build_run`: the model, the keyword
batches, `CausalLMLoss`, the Trainer) equals one big-batch step per window within 1e-12, on
one process and on 2 gloo ranks whose shards hold different token counts; counting the
unshifted labels moves it off by far more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from accumcore import Trainer
from accumcore.data import make_loader
from services.catalog.builders.own_models import CausalLMLoss
from services.spec import parse_spec
from services.worker.build import build_run
from tests.own_data_files import write_text
from tests.worker.exact_runs import float64_start, global_windows, largest_difference, run_ranks

WORLD = 2
M, N, LR = 2, 3, 0.5
GPT2 = {"name": "hf:gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 64,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def spec_for(root: Path, gpus: int) -> dict[str, Any]:
    return {
        "model": GPT2, "micro_batch_size": M, "accumulation_steps": N, "epochs": 1, "gpus": gpus,
        "dataset": {"name": "files", "data_root": str(root), "data_files": "text.jsonl",
                    "columns": {"text": "body"}, "tokenizer": "bytes", "packing": False, "max_len": 64},
        "optimizer": {"name": "sgd", "lr": LR},
    }


def reference(spec: dict[str, Any], world: int) -> tuple[list[torch.Tensor], int]:
    """Initial weights as the job draws them; per window, the mean over every scored token of
    every rank's micro-batches, one SGD step."""
    parsed, bundle, model = float64_start(spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    windows = global_windows(parsed, bundle, M, N * world, bundle.keyword_collate_fn)
    for batches in windows:
        total = sum(int((b["targets"][:, 1:] != -100).sum()) for b in batches)
        loss = sum(
            torch.nn.functional.cross_entropy(
                model(**b["inputs"]).logits[:, :-1].reshape(-1, 256), b["targets"][:, 1:].reshape(-1),
                ignore_index=-100, reduction="sum")
            for b in batches
        ) / total
        loss.backward()  # type: ignore[union-attr]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach() for p in model.parameters()], len(windows)


def direct_run(spec: dict[str, Any], shift_labels: bool) -> list[torch.Tensor]:
    parsed, bundle, model = float64_start(spec)
    loader = make_loader(bundle.train, M, shuffle=True, seed=parsed.seed, collate_fn=bundle.keyword_collate_fn)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=LR), loss_fn=CausalLMLoss(),
                      accumulation_steps=N, shift_labels=shift_labels)
    trainer.fit(loader, epochs=1)
    return [p.detach() for p in model.parameters()]


def test_the_window_update_is_the_big_batch_and_unshifted_counts_are_not(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    write_text(tmp_path, "jsonl")
    spec = spec_for(tmp_path, gpus=0)
    run = build_run(parse_spec(spec), callbacks=[], checkpoint_dir=None, device="cpu",
                    wrap_model=lambda m: m.double())
    assert run.trainer.shift_labels is True
    history = run.trainer.fit(run.train_loader, **{**run.fit_kwargs, "val_loader": None})
    expected, windows = reference(spec, 1)
    assert windows == len(history.steps) == run.total_steps == 3  # 7 micro-batches: 3, 3, 1
    assert largest_difference([p.detach() for p in run.trainer.model.parameters()], expected) <= 1e-12
    assert largest_difference(direct_run(spec, shift_labels=True), expected) <= 1e-12
    # Counting labels[..., :] (one more item per row) weighs rows wrongly: far off.
    assert largest_difference(direct_run(spec, shift_labels=False), expected) > 1e-6


def scored_tokens(batch: Any) -> int:
    return int((batch["targets"][:, 1:] != -100).sum())


def test_two_ranks_with_different_token_counts_equal_the_big_batch(tmp_path: Path) -> None:
    write_text(tmp_path / "data", "jsonl")
    spec = spec_for(tmp_path / "data", WORLD)
    results = run_ranks(spec, WORLD, tmp_path, scored_tokens)
    assert results[0]["items"] != results[1]["items"]
    expected, windows = reference(spec, WORLD)
    for result in results:
        assert result["steps"] == windows == 2  # rank 0: 4 micro-batches, rank 1: 3
        assert largest_difference(result["params"], expected) <= 1e-12

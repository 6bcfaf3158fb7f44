"""Your own data through the worker's run (`build_run`), against the plain tools.

    .venv/bin/python -m bench.service.own_data --threads 1 --clock cpu [--quick] [--out]

- imagefolder: samples/s of the worker's run (ImageFolder, transforms, accumcore Trainer with
  exact accumulation) over a generated folder, against a plain DataLoader loop over the same
  folder and transforms with the same model and optimizer (target >= 0.95).
- tiny GPT-2 on jsonl text (tokenizer bytes, packed blocks): tokens/s of the worker's run
  against transformers' `Trainer` on the same model, data and m x N (target >= 1.0). The
  Trainer needs accelerate, which lives in the peers' environment (bench/harness/peers.py): the
  script re-runs itself there.
- exactness on a short last window (13 padded rows, m = 2, N = 3: windows 3, 3, 1) in float64:
  the largest parameter difference from the big-batch update, accumcore (target <= 1e-12)
  and transformers' Trainer (its loss upcasts logits to float32).

Each ratio is the median of per-round ratios of interleaved runs (A B, B A, ...).
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.harness import common as _common
from bench.harness import peers as _peers
from tests.own_data_files import make_image_folder, write_text

GPT2 = {"name": "hf:gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 64,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def image_spec(root: Path, epochs: int) -> dict[str, Any]:
    return {"model": "small_cnn", "micro_batch_size": 16, "accumulation_steps": 2, "epochs": epochs, "gpus": 0,
            "dataset": {"name": "imagefolder", "data_root": str(root), "image_size": 32, "val_fraction": 0.2},
            "optimizer": {"name": "adamw", "lr": 0.001}}


def accum_images(spec: dict[str, Any]) -> float:
    from services.spec import parse_spec
    from services.worker.build import build_run

    run = build_run(parse_spec(spec), callbacks=[], checkpoint_dir=None, device="cpu")
    samples = len(run.train_loader.dataset) * spec["epochs"]
    seconds = _common.timed(lambda: run.trainer.fit(run.train_loader, **{**run.fit_kwargs, "val_loader": None}))
    return samples / seconds


def plain_images(spec: dict[str, Any]) -> float:
    """torchvision ImageFolder + DataLoader + the naive loop (loss / N), same model and data."""
    from torchvision.datasets import ImageFolder

    from services.catalog.build import build_model
    from services.catalog.builders.own_data import Labelled, image_transforms, split_indices

    options = spec["dataset"]
    train_tf, _ = image_transforms(options)
    folder = ImageFolder(options["data_root"], transform=train_tf)
    train_idx, _ = split_indices(len(folder), options["val_fraction"], 0)
    data = Labelled(folder, train_idx, folder.targets)
    torch.manual_seed(0)
    model = build_model("small_cnn", _image_info(len(folder.classes)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.001)
    loader = torch.utils.data.DataLoader(data, batch_size=spec["micro_batch_size"], shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    n = spec["accumulation_steps"]

    def fit() -> None:
        for _ in range(spec["epochs"]):
            for i, (x, y) in enumerate(loader):
                (torch.nn.functional.cross_entropy(model(x), y) / n).backward()
                if (i + 1) % n == 0 or i + 1 == len(loader):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)

    return len(data) * spec["epochs"] / _common.timed(fit)


def _image_info(classes: int) -> Any:
    from dataclasses import replace

    from services.catalog import require_dataset

    return replace(require_dataset("imagefolder"), num_classes=classes, image_size=32)


def text_spec(root: Path, steps: int) -> dict[str, Any]:
    return {"model": GPT2, "micro_batch_size": 8, "accumulation_steps": 2, "max_steps": steps, "gpus": 0,
            "grad_clip_norm": 1.0,
            "dataset": {"name": "files", "data_root": str(root), "data_files": "text.jsonl",
                        "columns": {"text": "body"}, "tokenizer": "bytes", "max_len": 64},
            "optimizer": {"name": "adamw", "lr": 0.001}}


def tokens_in(bundle: Any, rows: int) -> int:
    return sum(int(bundle.train[i % len(bundle.train)].shape[0]) for i in range(rows))


def accum_tokens(spec: dict[str, Any]) -> float:
    from services.spec import parse_spec
    from services.worker.build import build_data, build_run

    parsed = parse_spec(spec)
    run = build_run(parsed, callbacks=[], checkpoint_dir=None, device="cpu")
    rows = spec["max_steps"] * spec["micro_batch_size"] * spec["accumulation_steps"]
    tokens = tokens_in(build_data(parsed, None), rows)
    return tokens / _common.timed(lambda: run.trainer.fit(run.train_loader, **{**run.fit_kwargs, "val_loader": None}))


class KeywordRows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Token rows as the dicts transformers' Trainer expects."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[index]}


def hf_collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    from services.catalog.builders.own_data import token_collate

    batch = token_collate(True)([r["input_ids"] for r in rows])
    return {**batch["inputs"], "labels": batch["targets"]}


def hf_trainer(spec: dict[str, Any], model: Any, data: Any, out: str, **changes: Any) -> Any:
    from transformers import Trainer, TrainingArguments

    args = {"output_dir": out, "use_cpu": True, "report_to": "none", "save_strategy": "no",
            "logging_strategy": "no", "eval_strategy": "no", "disable_tqdm": True, "dataloader_num_workers": 0,
            "per_device_train_batch_size": spec["micro_batch_size"],
            "gradient_accumulation_steps": spec["accumulation_steps"], "optim": "adamw_torch",
            "learning_rate": spec["optimizer"]["lr"], "lr_scheduler_type": "constant", "weight_decay": 0.0,
            "max_grad_norm": spec.get("grad_clip_norm") or 0.0, "seed": 0, **changes}
    return Trainer(model=model, args=TrainingArguments(**args), train_dataset=KeywordRows(data),
                   data_collator=hf_collate)


def hf_tokens(spec: dict[str, Any]) -> float:
    from services.catalog.build import build_model
    from services.spec import parse_spec
    from services.worker.build import build_data

    parsed = parse_spec(spec)
    bundle = build_data(parsed, None)
    torch.manual_seed(0)
    model = build_model(parsed.model.name, bundle, **parsed.model.options)
    rows = spec["max_steps"] * spec["micro_batch_size"] * spec["accumulation_steps"]
    with tempfile.TemporaryDirectory() as out:
        trainer = hf_trainer(spec, model, bundle.train, out, max_steps=spec["max_steps"])
        return tokens_in(bundle, rows) / _common.timed(trainer.train)


def exactness(root: Path, with_hf: bool) -> dict[str, float | None]:
    """Largest |parameter - big batch| after one epoch of windows 3, 3, 1 in float64."""
    from accumcore import Trainer
    from accumcore.data import make_loader
    from services.catalog.build import build_model
    from services.catalog.builders.own_models import CausalLMLoss
    from services.spec import parse_spec
    from services.worker.build import build_data

    spec = {**text_spec(root, 1), "max_steps": None, "epochs": 1, "micro_batch_size": 2, "accumulation_steps": 3,
            "grad_clip_norm": None, "optimizer": {"name": "sgd", "lr": 0.5},
            "dataset": {**text_spec(root, 1)["dataset"], "data_files": "short.jsonl", "packing": False}}
    parsed = parse_spec(spec)
    bundle = build_data(parsed, None)

    def fresh() -> Any:
        torch.manual_seed(0)
        return build_model(parsed.model.name, bundle, **parsed.model.options).double()

    batches = list(make_loader(bundle.train, 2, shuffle=False, collate_fn=bundle.keyword_collate_fn))
    reference = fresh()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for w in range(math.ceil(len(batches) / 3)):
        window = batches[3 * w: 3 * w + 3]
        total = sum(int((b["targets"][:, 1:] != -100).sum()) for b in window)
        loss = sum(torch.nn.functional.cross_entropy(
            reference(**b["inputs"]).logits[:, :-1].reshape(-1, 256), b["targets"][:, 1:].reshape(-1),
            reduction="sum") for b in window) / total
        loss.backward()  # type: ignore[union-attr]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    expected = [p.detach() for p in reference.parameters()]

    def difference(model: Any) -> float:
        return max(float((p.detach() - q).abs().max()) for p, q in zip(model.parameters(), expected, strict=True))

    model = fresh()
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), loss_fn=CausalLMLoss(), accumulation_steps=3,
            shift_labels=True).fit(make_loader(bundle.train, 2, shuffle=False, collate_fn=bundle.keyword_collate_fn),
                                   epochs=1)
    result: dict[str, float | None] = {"accum_max_abs_diff": difference(model), "hf_trainer_max_abs_diff": None}
    if with_hf:
        model = fresh()
        with tempfile.TemporaryDirectory() as out:
            hf_trainer(spec, model, bundle.train, out, num_train_epochs=1, optim="sgd",
                       train_sampling_strategy="sequential").train()
        result["hf_trainer_max_abs_diff"] = difference(model)
    return result


def main() -> None:
    parser = _common.base_parser(__doc__ or "")
    args = parser.parse_args()
    peers_missing = _peers.reexec_in_peers_env(args.quick)  # transformers' Trainer needs accelerate
    _common.configure(args)
    repeats = args.repeats or (1 if args.quick else 5)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_image_folder(root / "images", per_class=8 if args.quick else 40, size=48)
        write_text(root / "text", "jsonl", repeat=2 if args.quick else 20)
        short = root / "text" / "short.jsonl"
        short.write_text("".join((root / "text" / "text.jsonl").read_text().splitlines(True)[:14]))
        images = image_spec(root / "images", epochs=1 if args.quick else 2)
        image_runs = _common.interleaved({"accum": lambda: accum_images(images), "plain": lambda: plain_images(images)},
                                         repeats, _common.warmups(args))
        image_ratio = _common.paired_ratio(image_runs["accum"], image_runs["plain"])
        text = text_spec(root / "text", steps=2 if args.quick else 12)
        runners = {"accum": lambda: accum_tokens(text)}
        if peers_missing is None:
            runners["hf_trainer"] = lambda: hf_tokens(text)
        token_runs = _common.interleaved(runners, repeats, _common.warmups(args))
        token_ratio = (_common.paired_ratio(token_runs["accum"], token_runs["hf_trainer"])
                       if "hf_trainer" in token_runs else None)
        exact = exactness(root / "text", with_hf=peers_missing is None)
    result = {
        "machine": _common.machine("cpu"),
        "imagefolder": {"target": ">= 0.95", "ratio": image_ratio,
                        "verdict": _common.verdict(image_ratio, 0.95, True),
                        "samples_per_s": {k: _common.median(v) for k, v in image_runs.items()}, "runs": image_runs},
        "gpt2_tokens": {"target": ">= 1.0", "ratio": token_ratio, "peer": peers_missing or _peers.peer_versions(),
                        "verdict": _common.verdict(token_ratio, 1.0, True),
                        "tokens_per_s": {k: _common.median(v) for k, v in token_runs.items()}, "runs": token_runs},
        "short_last_window_float64": {**exact, "target": "accum <= 1e-12",
                                      "verdict": _common.verdict(exact["accum_max_abs_diff"], 1e-12, False)},
    }
    _common.emit("own_data", result, args)


if __name__ == "__main__":
    sys.exit(main())

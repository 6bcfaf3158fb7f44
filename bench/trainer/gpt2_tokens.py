"""Tiny GPT-2 tokens/s: accumcore's Trainer / transformers' Trainer, the library alone.

Issue 32's GPT-2 row without the service stack (`service/own_data.py` measures the same
through the worker's `build_run`, which needs the API's packages): the model and settings of
own_data's text job, built directly. `hf:gpt2` with 2 layers, 64-wide, 2 heads, 64 positions,
no dropout, a 256-token (byte) vocabulary; packed rows of 64 random byte tokens; m=8, N=2,
AdamW (lr 1e-3, no weight decay, torch's default kernels on both sides), clipping at 1.0,
fp32, `steps` optimizer steps per run. Both sides read the same rows from host memory
(pinned on a GPU) and train a fresh copy of the same model each run:

- accum: `make_loader` + `Trainer(loss_fn=CausalLMLoss(), shift_labels=True,
  grad_clip_norm=1.0)`, one `fit` timed (the Trainer built outside the timer).
- transformers: `Trainer(args=TrainingArguments(...))` with the same m, N, optimizer,
  clipping, constant LR and no logging, saving or evaluation; one `train()` timed.

Figure: the median of per-round ratios of tokens/s (interleaved rounds); target >= 1.0. The
transformers Trainer needs accelerate: where it is missing the figure is not measured.

    python -m bench.trainer.gpt2_tokens [--quick] [--out [DIR]] [--repeats K] [--steps S]
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import sys
import tempfile
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from accumcore import Trainer
from accumcore.data import make_loader
from bench.harness import common as _common

M, N, LENGTH, VOCAB = 8, 2, 64, 256
CONFIG = {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": LENGTH, "resid_pdrop": 0.0,
          "embd_pdrop": 0.0, "attn_pdrop": 0.0, "vocab_size": VOCAB,
          "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


class CausalLMLoss(nn.Module):
    """The service's loss (services/catalog/builders/own_models.py), copied so that this bench
    imports no service package: mean cross-entropy of logits[..., :-1] vs labels[..., 1:]."""

    reduction = "mean"
    ignore_index = -100

    def forward(self, outputs: Any, labels: torch.Tensor) -> torch.Tensor:
        logits = outputs.logits if hasattr(outputs, "logits") else outputs
        shifted = logits[..., :-1, :]
        return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), labels[..., 1:].reshape(-1),
                               ignore_index=self.ignore_index)


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.rows[index]


def accum_collate(rows: list[torch.Tensor]) -> dict[str, Any]:
    ids = torch.stack(rows)
    return {"inputs": {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "targets": ids.clone()}


def hf_collate(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    ids = torch.stack(rows)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def build_model() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**CONFIG))


def accum_tokens(base: nn.Module, data: Rows, device: str) -> float:
    model = copy.deepcopy(base).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    loader = make_loader(data, M, seed=0, collate_fn=accum_collate, pin_memory=device == "cuda")
    trainer = Trainer(model, optimizer, loss_fn=CausalLMLoss(), accumulation_steps=N, grad_clip_norm=1.0,
                      device=device, shift_labels=True)
    return len(data) * LENGTH / _common.timed(lambda: trainer.fit(loader, epochs=1))


def hf_tokens(base: nn.Module, data: Rows, device: str, steps: int) -> float:
    from transformers import Trainer as HFTrainer
    from transformers import TrainingArguments

    model = copy.deepcopy(base)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, use_cpu=device == "cpu", report_to="none", save_strategy="no", logging_strategy="no",
            eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0, per_device_train_batch_size=M,
            gradient_accumulation_steps=N, optim="adamw_torch", learning_rate=1e-3, lr_scheduler_type="constant",
            weight_decay=0.0, max_grad_norm=1.0, seed=0, max_steps=steps)
        trainer = HFTrainer(model=model, args=args, train_dataset=data, data_collator=hf_collate)
        with contextlib.redirect_stdout(sys.stderr):  # it prints its run's metrics: stdout holds our JSON alone
            return len(data) * LENGTH / _common.timed(trainer.train)


def main() -> None:
    parser = _common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    args = parser.parse_args()
    _common.configure(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = args.steps or (2 if args.quick else (150 if device == "cuda" else 12))
    repeats = args.repeats or (1 if args.quick else 5)
    missing = [name for name in ("transformers", "accelerate") if importlib.util.find_spec(name) is None]
    result: dict[str, Any] = {
        "machine": _common.machine(device),
        "figure": f"tiny GPT-2 (2 layers, 64 wide) tokens/s, accum Trainer / transformers Trainer, m={M} x N={N}, "
                  f"fp32, {steps} steps a run",
        "target": 1.0, "steps": steps, "repeats": repeats, "tokens_per_run": steps * M * N * LENGTH,
    }
    if "transformers" in missing:
        _common.emit("gpt2_tokens", {**result, "measured": None, "verdict": "not measured",
                                     "skipped": "transformers not installed"}, args)
        return
    import transformers

    generator = torch.Generator().manual_seed(0)
    data = Rows(torch.randint(0, VOCAB, (steps * M * N, LENGTH), generator=generator))
    base = build_model()
    runners = {"accum": lambda: accum_tokens(base, data, device)}
    if not missing:
        runners["hf_trainer"] = lambda: hf_tokens(base, data, device, steps)
    runs = _common.interleaved(runners, repeats, _common.warmups(args))
    ratio = _common.paired_ratio(runs["accum"], runs["hf_trainer"]) if "hf_trainer" in runs else None
    versions = {"transformers": transformers.__version__}
    if not missing:
        import accelerate

        versions["accelerate"] = accelerate.__version__
    _common.emit("gpt2_tokens", {
        **result, "measured": ratio, "verdict": _common.verdict(ratio, 1.0, True),
        "peer": versions if not missing else f"not measured: {', '.join(missing)} not installed",
        "tokens_per_s": {k: _common.median(v) for k, v in runs.items()}, "runs": runs,
    }, args)


if __name__ == "__main__":
    main()

"""The memory levers beside accumulation, on the CPU: activation checkpointing and LoRA.

- Activation memory: the peak the CPU allocator reaches above where it started during one
  micro-batch's forward and backward (torch's profiler, `profile_memory=True`, as
  bench/trainer/memory.py reads it; gradients already allocated, so the peak is activations and
  the backward's temporaries), plain against `accumcore.checkpoint_activations` (every block),
  for a tiny GPT-2 (transformers config), a ViT-Tiny and a ResNet-18 (timm, no weights).
- Recompute cost: seconds of `Trainer.fit` over the same windows, checkpointed / plain
  (interleaved rounds, median of per-round ratios).
- LoRA (peft, r 8 on GPT-2's c_attn, as a job's `peft` builds it): trainable parameters and the
  AdamW state bytes after one step, against full fine-tuning.
- The GPU rows of issue 44 (deberta-v3-large and a 1B causal LM, 512 tokens, m=4): not measured
  without a GPU; the parameter and optimizer-state arithmetic of both models (built on the meta
  device from their configs, no download) and the CPU ratios that predict them are recorded.

    .venv/bin/python -m bench.trainer.memory_levers [--quick] [--out] [--repeats K] [--threads T]
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from accumcore import Trainer, checkpoint_activations
from accumcore.peak_memory import memory_events
from bench.harness import common as _common

N_ACC = 2
LORA_R, LORA_ALPHA = 8, 16


class _Logits(nn.Module):
    """A transformers causal LM as logits, so every workload is `model(x)` -> logits."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner(tokens).logits


def _gpt2_config(quick: bool) -> Any:
    from transformers import GPT2Config

    if quick:
        return GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    return GPT2Config(vocab_size=1024, n_positions=256, n_embd=128, n_layer=4, n_head=4)


def _workloads(quick: bool) -> dict[str, tuple[Callable[[], nn.Module], Callable[[int], tuple[torch.Tensor, torch.Tensor]], int]]:
    """name -> (build the model, make a batch of m, m)."""
    import timm
    from transformers import GPT2LMHeadModel

    config = _gpt2_config(quick)
    length = config.n_positions
    side = 32 if quick else 64
    m_text, m_image = (2, 2) if quick else (8, 16)

    def tokens(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, config.vocab_size, (m, length))
        return ids, ids

    def images(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(m, 3, side, side), torch.randint(0, 10, (m,))

    smaller: dict[str, Any] = {"depth": 1, "embed_dim": 32, "num_heads": 2} if quick else {}
    stages: dict[str, Any] = {"layers": (1, 1, 1, 1)} if quick else {}  # a smoke run's sizes
    return {
        f"gpt2 {config.n_layer}x{config.n_embd}, {length} tokens": (
            lambda: _Logits(GPT2LMHeadModel(config)), tokens, m_text),
        f"vit_tiny patch 8, {side}x{side}": (
            lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=side, patch_size=8,
                                      num_classes=10, **smaller), images, m_image),
        f"resnet18, {side}x{side}": (
            lambda: timm.create_model("resnet18", pretrained=False, num_classes=10, **stages), images, m_image),
    }


def _loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if outputs.dim() == 3:  # a causal LM: next-token loss
        shifted = outputs[:, :-1]
        return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets[:, 1:].reshape(-1))
    return F.cross_entropy(outputs, targets)


def activation_peak(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """Bytes the allocator rises above its start during one forward and backward (the
    gradients exist already: a first backward before, untimed)."""
    inputs, targets = batch
    _loss(model(inputs), targets).backward()

    def step() -> None:
        _loss(model(inputs), targets).backward()

    events = memory_events(step)
    totals = [e["args"].get("Total Allocated", 0) for e in events]
    start = totals[0] - events[0]["args"].get("Bytes", 0)
    return int(max(totals) - start)


def fit_seconds(model: nn.Module, batches: list[Any]) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    trainer = Trainer(model, optimizer, loss_fn=_loss, accumulation_steps=N_ACC, count_items="rows",
                      verify_window=False, grad_norm=False)
    return _common.timed(lambda: trainer.fit(batches, epochs=1))


def checkpointing_rows(quick: bool, repeats: int, warmup: int) -> dict[str, Any]:
    rows = {}
    for name, (build, batch_of, m) in _workloads(quick).items():
        torch.manual_seed(0)
        plain = build().train()
        checkpointed = checkpoint_activations(copy.deepcopy(plain))
        batch = batch_of(m)
        peaks = {"plain": activation_peak(plain, batch), "checkpointed": activation_peak(checkpointed, batch)}
        batches = [batch_of(m) for _ in range(N_ACC * (1 if quick else 2))]
        times = _common.interleaved({"plain": lambda p=plain, b=batches: fit_seconds(p, b),
                                     "checkpointed": lambda c=checkpointed, b=batches: fit_seconds(c, b)},
                                    repeats, warmup)
        rows[name] = {
            "m": m,
            "parameters": sum(p.numel() for p in plain.parameters()),
            "activation_peak_mb": {k: v / 2**20 for k, v in peaks.items()},
            "activation_ratio": peaks["checkpointed"] / peaks["plain"],
            "fit_seconds": times,
            "step_time_ratio": _common.paired_ratio(times["checkpointed"], times["plain"]),
        }
        print(f"{name}: {rows[name]['activation_ratio']:.3f} of the activations, "
              f"{rows[name]['step_time_ratio']:.3f}x the time", file=sys.stderr, flush=True)
    return rows


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for state in optimizer.state.values()
               for v in state.values() if isinstance(v, torch.Tensor))


def lora_row(quick: bool) -> dict[str, Any]:
    """Trainable parameters and AdamW state bytes after one step: full fine-tuning and LoRA."""
    import peft
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    config = _gpt2_config(quick)
    tokens = torch.randint(0, config.vocab_size, (2, config.n_positions))
    measured = {}
    for kind in ("full", "lora"):
        model: nn.Module = GPT2LMHeadModel(config)
        if kind == "lora":
            model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA,
                                                               target_modules=["c_attn"], fan_in_fan_out=True))
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=1e-4)
        _loss(model(tokens).logits, tokens).backward()
        optimizer.step()
        measured[kind] = {"trainable": sum(p.numel() for p in trained),
                          "total": sum(p.numel() for p in model.parameters()),
                          "optimizer_state_bytes": _state_bytes(optimizer)}
    return {**measured, "state_ratio": measured["lora"]["optimizer_state_bytes"] / measured["full"]["optimizer_state_bytes"]}


def _meta_parameters(kind: str) -> tuple[int, int]:
    """(all parameters, LoRA r 8 parameters on the attention's query and value) of the issue's
    GPU models, built on the meta device from their configs (no weights, no download)."""
    import transformers

    if kind == "deberta-v3-large":
        config: Any = transformers.DebertaV2Config(
            vocab_size=128100, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
            intermediate_size=4096, max_position_embeddings=512, relative_attention=True, position_buckets=256,
            norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
            num_labels=2)
        build, targets = transformers.AutoModelForSequenceClassification, ("query_proj", "value_proj")
    else:  # a 1B causal LM: Llama-3.2-1B's shape
        config = transformers.LlamaConfig(
            vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
            intermediate_size=8192, tie_word_embeddings=True)
        build, targets = transformers.AutoModelForCausalLM, ("q_proj", "v_proj")
    with torch.device("meta"):
        model = build.from_config(config)
    lora = sum(LORA_R * (module.in_features + module.out_features) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets)
    return sum(p.numel() for p in model.parameters()), lora


def gpu_predictions(quick: bool) -> dict[str, Any]:
    """What a GPU run would measure, and the arithmetic that predicts its memory: AdamW keeps 8
    bytes of state per trained parameter (fp32 moments), weights and gradients 4 each."""
    if quick:
        return {}
    found = {}
    for kind in ("deberta-v3-large", "llama-1b"):
        total, lora = _meta_parameters(kind)
        found[kind] = {
            "parameters": total, "lora_parameters": lora,
            "full_adamw_gb": total * (4 + 4 + 8) / 1e9,
            "lora_adamw_gb": (total * 4 + lora * (4 + 4 + 8)) / 1e9,
            "status": "not measured: no GPU was lent to this session",
        }
    return found


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    _common.configure(args)
    repeats = 1 if args.quick else (args.repeats or 5)
    rows = checkpointing_rows(args.quick, repeats, _common.warmups(args))
    lora = lora_row(args.quick)
    worst = max(row["activation_ratio"] for row in rows.values())
    _common.emit("memory_levers", {
        "machine": _common.machine("cpu"),
        "figure": "activation peak, checkpointing every block / plain (worst workload)",
        "target": "< 1 (less memory)", "measured": worst, "verdict": "pass" if worst < 1 else "miss",
        "workloads": rows, "lora": lora, "gpu": gpu_predictions(args.quick),
        "config": {"n_acc": N_ACC, "repeats": repeats, "lora_r": LORA_R, "lora_alpha": LORA_ALPHA},
    }, args)


if __name__ == "__main__":
    main()

"""ResNet-50 bf16 images/s: accumcore's fast path / the best hand-written loop (GPU).

Issue 32's row "ResNet-50 bf16 vs the best hand loop": the trainer library alone (no API, no
worker, no database), at the job's settings of `service/resnet50_h100.py` (224x224 synthetic
images, m=256, N=1, SGD momentum 0.9, bf16). Both sides get the same images, held on the GPU,
the same model weights, `cudnn.benchmark` on, channels_last weights and fused SGD:

- accum: `fast_path.prepare(model, sgd, "cuda", "bf16")` + `DeviceBatches` + a fresh
  `Trainer(precision="bf16")` per epoch (its item weighting, grad-norm metric and per-micro-batch
  RNG keys included), as the worker runs a fast-path job.
- loop: the hand loop with the same speed-ups and nothing else: bf16 autocast, `loss / N`,
  backward, fused `step`, `zero_grad(set_to_none=True)`; batches sliced by a `randperm` made on
  the GPU.

`--compile` also runs both with `model.compile()` (forward compiled; the backward through
AOTAutograd), as `compile: true` does; the row's figure is then accum's best / the loop's best.
Target: within 3 % (ratio >= 0.97), and accum's img/s above 3,663 (the 11-24 job on one H100).
Without a GPU it reports `skipped: no GPU` (`--quick` runs the code path on tiny images on the CPU).

    python -m bench.trainer.resnet50_best_loop [--quick] [--compile] [--out [DIR]] [--repeats K]
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from accumcore import fast_path
from accumcore.device_data import DeviceBatches
from bench.harness import common as _common
from bench.harness import workloads as w

TARGET_RATIO = 0.97
TARGET_IMAGES_PER_S = 3663.0
OPTIMIZER = {"name": "sgd", "lr": 0.1, "momentum": 0.9}


def _hand_loop(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
               m: int, n_acc: int, generator: torch.Generator, device: str, precision: str) -> None:
    model.train()
    order = torch.randperm(len(inputs), device=inputs.device, generator=generator)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")
    for index, start in enumerate(range(0, len(inputs), m)):
        batch = order[start:start + m]
        with autocast:
            loss = nn.functional.cross_entropy(model(inputs[batch]), targets[batch])
        (loss / n_acc).backward()
        if (index + 1) % n_acc == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def _pair(base: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, m: int, n_acc: int, repeats: int,
          warmup: int, device: str, precision: str, compile: bool) -> dict[str, Any]:
    images = len(inputs)
    started = time.perf_counter()
    accum_model, accum_opt = fast_path.prepare(w.clone(base), OPTIMIZER, device, precision, compile=compile)
    loop_model, loop_opt = fast_path.prepare(w.clone(base), OPTIMIZER, device, precision, compile=compile)
    batches = DeviceBatches(inputs, targets, m, seed=0, device=device)
    generator = torch.Generator(device=inputs.device).manual_seed(0)
    loss_fn = nn.CrossEntropyLoss()

    def accum() -> float:
        return images / _common.timed(
            lambda: w.run_trainer(accum_model, accum_opt, batches, n_acc, loss_fn, device, precision))

    def loop() -> float:
        return images / _common.timed(
            lambda: _hand_loop(loop_model, loop_opt, inputs, targets, m, n_acc, generator, device, precision))

    # The first epoch of each side (cuDNN's autotuning, and with --compile the compilation) is
    # timed apart: it is what a short job pays once.
    first = {"accum": accum(), "loop": loop()}
    runs = _common.interleaved({"accum": accum, "loop": loop}, repeats, max(warmup - 1, 0))
    return {
        "compiled": compile, "m": m, "N": n_acc, "images_per_epoch": images,
        "accum_images_per_s": _common.median(runs["accum"]),
        "loop_images_per_s": _common.median(runs["loop"]),
        "ratio": _common.paired_ratio(runs["accum"], runs["loop"]),
        "first_epoch_images_per_s": first,
        "wall_s": time.perf_counter() - started,
        "runs": runs,
    }


def main() -> None:
    parser = _common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="also run both sides with model.compile()")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per epoch (default 8)")
    args = parser.parse_args()
    _common.configure(args)
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    result: dict[str, Any] = {
        "machine": _common.machine(device),
        "figure": "ResNet-50 bf16 img/s, accum fast path / best hand loop (same speed-ups), 224x224 m=256 N=1",
        "target": TARGET_RATIO,
    }
    if not gpu and not args.quick:
        _common.emit("resnet50_best_loop", {**result, "measured": None, "verdict": "not measured",
                                            "skipped": "no GPU: torch.cuda.is_available() is False"}, args)
        return
    import torchvision

    m, n_acc, size = (2, 1, 32) if args.quick else (256, 1, 224)
    steps = args.steps or (2 if args.quick else 8)
    repeats = args.repeats or (1 if args.quick else 5)
    warmup = _common.warmups(args) + 1  # one more untimed round on the GPU: clocks up
    torch.backends.cudnn.benchmark = gpu  # as the worker sets it for a fast-path job
    generator = torch.Generator(device=device).manual_seed(0)
    inputs = torch.randn(m * n_acc * steps, 3, size, size, device=device, generator=generator)
    targets = torch.randint(0, 1000, (len(inputs),), device=device, generator=generator)
    torch.manual_seed(0)
    base = torchvision.models.resnet50(num_classes=1000)
    pairs = {"eager": _pair(base, inputs, targets, m, n_acc, repeats, warmup, device, "bf16", False)}
    if args.compile:
        reason = fast_path.compile_available()
        pairs["compiled"] = (_pair(base, inputs, targets, m, n_acc, repeats, warmup, device, "bf16", True)
                             if reason is None else {"skipped": reason})
        if reason is None:  # a frame that failed to compile ran eagerly (suppress_errors): say so
            from torch._dynamo.utils import counters

            pairs["compiled"]["dynamo"] = {key: {k: v for k, v in list(counters[key].items())[:8]}
                                           for key in ("stats", "graph_break") if key in counters}
    measured = [p for p in pairs.values() if "ratio" in p]
    best_accum = max(p["accum_images_per_s"] for p in measured)
    best_loop = max(p["loop_images_per_s"] for p in measured)
    ratio = best_accum / best_loop
    verdict = _common.verdict(ratio, TARGET_RATIO, True)
    if verdict == "pass" and gpu and best_accum <= TARGET_IMAGES_PER_S:
        verdict = "miss"
    _common.emit("resnet50_best_loop", {
        **result, "measured": ratio, "verdict": verdict,
        "target_images_per_s": TARGET_IMAGES_PER_S,
        "accum_best_images_per_s": best_accum, "loop_best_images_per_s": best_loop,
        "eager_ratio": pairs["eager"]["ratio"],
        "repeats": repeats, "pairs": pairs,
        "loop": "hand loop: bf16 autocast, channels_last weights, fused SGD, GPU-held data, randperm on the GPU",
        "accum": "fast_path.prepare + DeviceBatches + Trainer(precision='bf16'), fresh Trainer per epoch",
    }, args)


if __name__ == "__main__":
    main()

"""Step throughput of accumcore's Trainer.fit / the tutorial accumulation loop.

Same model, data, loader, m, N and fp32 on both sides; repeats are interleaved (trainer,
loop, trainer, loop, ...) and the medians compared. Targets: >= 0.99 on CPU, >= 1.0 on GPU.
On a GPU it also measures the fast path (bf16 autocast, channels_last, fused AdamW, data held
on the device) against the tutorial loop on ResNet-50, synthetic 224x224, m=64: target >= 1.5.

    .venv/bin/python -m bench.trainer.trainer_vs_loop [--quick] [--out]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accumcore import fast_path
from accumcore.data import make_loader
from accumcore.device_data import DeviceBatches
from bench.harness import common as _common
from bench.harness import workloads as w


def _compare(name: str, model: nn.Module, data, m: int, n_acc: int, repeats: int, device: str,
             warmup: int = 1) -> dict[str, Any]:
    loss_fn = nn.CrossEntropyLoss()
    loader = make_loader(data, m, seed=0)
    models = {"trainer": w.clone(model).to(device), "loop": w.clone(model).to(device)}
    opts = {k: torch.optim.SGD(v.parameters(), lr=0.01, momentum=0.9) for k, v in models.items()}
    samples = len(data)

    def trainer() -> float:
        seconds = _common.timed(
            lambda: w.run_trainer(models["trainer"], opts["trainer"], loader, n_acc, loss_fn, device)
        )
        return samples / seconds

    def loop() -> float:
        loader.batch_sampler.set_epoch(0)  # the trainer resets it; the loop sees the same order
        seconds = _common.timed(
            lambda: w.tutorial_loop(models["loop"], opts["loop"], loader, n_acc, loss_fn, device)
        )
        return samples / seconds

    runs = _common.interleaved({"trainer": trainer, "loop": loop}, repeats, warmup)
    ratio = _common.paired_ratio(runs["trainer"], runs["loop"])
    return {
        "workload": name, "m": m, "N": n_acc, "samples_per_epoch": samples,
        "trainer_samples_per_s": _common.median(runs["trainer"]),
        "loop_samples_per_s": _common.median(runs["loop"]),
        "ratio": ratio, "ratio_of_medians": _common.median(runs["trainer"]) / _common.median(runs["loop"]),
        "runs": runs,
    }


def _resnet50_fast_vs_loop(repeats: int, steps: int, n_acc: int = 2, m: int = 64,
                           device: str = "cuda") -> dict[str, Any]:
    """GPU: ResNet-50 fast path (bf16, channels_last, fused AdamW, device data) / loop.

    (`device="cpu"` with tiny sizes only checks the code path; it is not a figure.)
    """
    import torchvision

    images = m * n_acc * steps
    data = w.image_data(images, (3, 224, 224), classes=1000)
    base = torchvision.models.resnet50(num_classes=1000)
    loss_fn = nn.CrossEntropyLoss()

    loop_model = w.clone(base).to(device)
    loop_opt = torch.optim.AdamW(loop_model.parameters(), lr=1e-3)
    loop_loader = make_loader(data, m, seed=0)

    fast_model, fast_opt = fast_path.prepare(w.clone(base), {"name": "adamw", "lr": 1e-3}, device, "bf16")
    fast_data = DeviceBatches(data.tensors[0], data.tensors[1], m, seed=0, device=device)

    def loop() -> float:
        return images / _common.timed(
            lambda: w.tutorial_loop(loop_model, loop_opt, loop_loader, n_acc, loss_fn, device)
        )

    def fast() -> float:
        return images / _common.timed(
            lambda: w.run_trainer(fast_model, fast_opt, fast_data, n_acc, loss_fn, device, "bf16")
        )

    runs = _common.interleaved({"fast": fast, "loop": loop}, repeats)
    return {
        "workload": "resnet50 synthetic 224x224", "m": m, "N": n_acc, "images_per_epoch": images,
        "fast_images_per_s": _common.median(runs["fast"]),
        "loop_images_per_s": _common.median(runs["loop"]),
        "ratio": _common.paired_ratio(runs["fast"], runs["loop"]),
        "fast_path": "bf16 autocast + channels_last + fused AdamW + DeviceBatches",
        "loop": "fp32, torch.optim.AdamW default, make_loader from host memory",
        "runs": runs,
    }


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    _common.configure(args)
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    repeats = args.repeats or (1 if args.quick else 9)
    warmup = _common.warmups(args)
    if args.quick:
        results = [
            _compare("mlp 64-16-16-10", w.mlp(64, 16), w.image_data(32, (1, 8, 8)), 4, 2, repeats, device, warmup),
            _compare("small_cnn 3x8x8", w.small_cnn(width=4), w.image_data(16, (3, 8, 8)), 4, 2, repeats, device, warmup),
        ]
    else:
        results = [
            _compare("mlp 784-256-256-10", w.mlp(), w.image_data(16384), 32, 4, repeats, device),
            _compare("small_cnn 3x32x32", w.small_cnn(), w.image_data(1024, (3, 32, 32)), 32, 4, repeats, device),
        ]
    target = 1.0 if gpu else 0.99
    worst = min(r["ratio"] for r in results)
    out: dict[str, Any] = {
        "machine": _common.machine(device),
        "figure": "Trainer.fit / tutorial loop throughput, fp32 (median of per-round ratios)",
        "target": target, "measured": worst, "verdict": _common.verdict(worst, target, True),
        "repeats": repeats, "results": results,
    }
    if gpu and not args.quick:
        fast = _resnet50_fast_vs_loop(repeats=3, steps=10)
        out["resnet50_fast_path"] = {**fast, "target": 1.5, "verdict": _common.verdict(fast["ratio"], 1.5, True)}
    else:
        out["resnet50_fast_path"] = {"skipped": "no GPU" if not gpu else "quick mode"}
    _common.emit("trainer_vs_loop", out, args)


if __name__ == "__main__":
    main()

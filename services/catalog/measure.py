"""Measure a catalog model's size with torch: parameters and activations per sample.

The torch-free estimate (`services.catalog.sizes`) is checked against this in
tests/catalog/test_sizes.py, and the torchvision rows of `services/catalog/model_sizes.py`
are written by it (torch builds each model once; the API never imports this module):

    .venv/bin/python -m services.catalog.measure --write   # rewrites model_sizes.py
"""

from __future__ import annotations

import argparse
import pprint
import sys
from pathlib import Path

import torch
from torch import nn

from services.catalog import MODELS, DatasetInfo, configured_dataset
from services.catalog.build import build_model
from services.catalog.families.torchvision import REFERENCE_CLASSES, TORCHVISION_MODELS

TABLE = Path(__file__).with_name("model_sizes.py")


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def activation_elements(model: nn.Module, sample: torch.Tensor) -> int:
    """Elements of every leaf module's output per sample of `sample` (a batch of 2): what
    backward keeps, roughly. Train mode, as in training (and no fused inference path that
    skips the modules); 2 samples so BatchNorm on a 1x1 map has more than one value."""
    total = 0

    def count(module: nn.Module, inputs: object, output: object) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel()

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(count) for m in leaves]
    try:
        model.train()
        with torch.no_grad():
            model(sample)
    finally:
        for hook in hooks:
            hook.remove()
    return total // sample.shape[0]


def sample_for(info: DatasetInfo) -> torch.Tensor:
    if info.max_seq_len is not None:
        return torch.zeros(2, info.max_seq_len, dtype=torch.long)
    return torch.zeros(2, *info.input_shape)


def torchvision_row(name: str) -> tuple[int, int, int]:
    """(parameters at REFERENCE_CLASSES classes, parameters per extra class, activation
    elements per sample) for a 32x32 RGB input, the catalog's smallest adapted side."""
    data = configured_dataset("fake", {"num_classes": REFERENCE_CLASSES})
    more = configured_dataset("fake", {"num_classes": REFERENCE_CLASSES + 1})
    torch.manual_seed(0)
    model = build_model(name, data)
    per_class = parameter_count(build_model(name, more)) - parameter_count(model)
    return parameter_count(model), per_class, activation_elements(model, sample_for(data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite {TABLE.name}")
    parser.add_argument("names", nargs="*", help="torchvision models (default: all)")
    args = parser.parse_args(argv)
    rows: dict[str, tuple[int, int, int]] = {}
    for name in args.names or sorted(TORCHVISION_MODELS):
        assert MODELS[name].source == "torchvision", name
        rows[name] = torchvision_row(name)
        print(name, rows[name], file=sys.stderr, flush=True)
    if args.write:
        TABLE.write_text(
            '"""Torchvision model sizes for the torch-free memory estimate (services.catalog.families.torchvision).\n\n'
            "Written by `python -m services.catalog.measure --write`; do not edit by hand.\n"
            "name -> (parameters at REFERENCE_CLASSES classes, parameters per extra class,\n"
            "activation elements per sample at the model's side for a 32x32 image).\n"
            '"""\n\n'
            f"TORCHVISION_SIZES: dict[str, tuple[int, int, int]] = {pprint.pformat(rows, width=99)}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

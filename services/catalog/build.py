"""Build datasets, models and losses from catalog names (imports torch).

    from services.catalog.build import build_dataset, build_model, build_loss
    bundle = build_dataset("digits")
    model = build_model("small_cnn", bundle)
    loss_fn = build_loss(bundle)
    loader = accumcore.data.make_loader(bundle.train, batch_size=16, collate_fn=bundle.collate_fn)

Unknown names and options raise ValueError listing what is allowed; missing data-root
datasets raise DatasetUnavailable naming the root and the fix. Each name's family
(`services.catalog.families`) names its builder as `"module:function"`, imported here only when
such a name is built: your own data and the `timm:`/`hf:`/plugin models (`own_data.py`,
`own_models.py`, the `models` extra) stay unimported on a worker that serves the catalog only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.catalog.builders.datasets import DatasetBundle, DatasetUnavailable
from services.catalog.builders.text import IGNORE_INDEX
from services.catalog.compatibility import mismatch
from services.catalog.entries import DatasetInfo
from services.catalog.families import dataset_family, model_family
from services.catalog.resolve import (
    configured_dataset,
    configured_model,
    require_dataset,
    require_model,
)

__all__ = [
    "DatasetBundle",
    "takes_keywords",
    "DatasetUnavailable",
    "TokenCrossEntropyLoss",
    "build_dataset",
    "build_loss",
    "build_model",
]


def build_dataset(
    name: str,
    *,
    data_root: str | Path | None = None,
    download: bool = False,
    seed: int = 0,
    **options: Any,
) -> DatasetBundle:
    """Both splits of catalog dataset `name`.

    Args:
        data_root: where mnist, fashion_mnist and cifar10 live (torchvision layout); default
            `$ACCUM_HOME/data`. Ignored by the other datasets.
        download: fetch missing data-root files (never done otherwise).
        seed: varies the `fake` data; the splits of the real datasets are fixed.
        options: dataset options listed in `DATASETS[name].options`.

    Raises:
        ValueError: unknown name or option. DatasetUnavailable: data-root files missing.
    """
    info = configured_dataset(name, options)
    root = Path(data_root) if data_root is not None else None
    builder = _builder(dataset_family(info).builder)
    bundle: DatasetBundle = builder(info, data_root=root, download=download, seed=seed, options=options)
    return bundle


def build_model(name: str, dataset: DatasetBundle | DatasetInfo | str, **options: Any) -> nn.Module:
    """A catalog, `timm:`, `hf:` or plugin model sized for `dataset` (a bundle, info or name);
    randomly initialised unless a namespace model says `pretrained: true`.

    Torchvision models get `num_classes` from the dataset and an input adapter (grayscale ->
    3 channels, small images upsampled to the model's minimum side); see `catalog.models`.

    Raises:
        ValueError: unknown name, option or option value, or a model incompatible with the
            dataset.
    """
    model_info = require_model(name)
    info = _dataset_info(dataset)
    if reason := mismatch(model_info, info):
        raise ValueError(reason)
    configured_model(name, options)  # option names and ranges: what the spec checks at submit
    model: nn.Module = _builder(model_family(model_info).builder)(model_info, info, options)
    return model


def _builder(path: str) -> Callable[..., Any]:
    """The function a family names as `"module:function"`, imported now (the worker only)."""
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


class TokenCrossEntropyLoss(nn.CrossEntropyLoss):
    """Cross-entropy over tokens: flattens (B, T, V) logits and (B, T) targets, ignores -100,
    and returns the mean over the non-ignored tokens (what the trainer's item count expects)."""

    def __init__(self) -> None:
        super().__init__(ignore_index=IGNORE_INDEX, reduction="mean")

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().forward(input.reshape(-1, input.shape[-1]), target.reshape(-1))


def build_loss(dataset: DatasetBundle | DatasetInfo | str, model: nn.Module | None = None) -> nn.Module:
    """Mean-over-items cross-entropy with ignore_index=-100, token-flattening for text; for a
    Hugging Face causal LM the shifted loss (`own_models.CausalLMLoss`)."""
    info = _dataset_info(dataset)
    if info.task == "language_modeling" and model is not None and takes_keywords(model):
        from services.catalog.builders.own_models import CausalLMLoss

        return CausalLMLoss()
    if info.task == "language_modeling":
        return TokenCrossEntropyLoss()
    return nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)


def takes_keywords(model: nn.Module) -> bool:
    """A Hugging Face model: batches go to it as keyword arguments (`model(**inputs)`)."""
    return hasattr(model, "config") and hasattr(model, "can_generate")


def _dataset_info(dataset: DatasetBundle | DatasetInfo | str) -> DatasetInfo:
    if isinstance(dataset, DatasetBundle):
        return dataset.info
    if isinstance(dataset, DatasetInfo):
        return dataset
    return require_dataset(dataset)

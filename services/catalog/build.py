"""Build datasets, models and losses from catalog names (imports torch).

    from services.catalog.build import build_dataset, build_model, build_loss
    bundle = build_dataset("digits")
    model = build_model("small_cnn", bundle)
    loss_fn = build_loss(bundle)
    loader = accumcore.data.make_loader(bundle.train, batch_size=16, collate_fn=bundle.collate_fn)

Unknown names and options raise ValueError listing what is allowed; missing data-root
datasets raise DatasetUnavailable naming the root and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.catalog import datasets as _datasets
from services.catalog import models as _models
from services.catalog.datasets import DatasetBundle, DatasetUnavailable, default_data_root
from services.catalog.names import (
    DatasetInfo,
    check_compatible,
    configured_dataset,
    configured_model,
    require_dataset,
    require_model,
)
from services.catalog.text import IGNORE_INDEX

__all__ = [
    "DatasetBundle",
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
    if name == "digits":
        return _datasets.digits(info)
    if name == "fake":
        return _datasets.fake(info, seed)
    if name == "text":
        return _datasets.text(info)
    root = Path(data_root).expanduser() if data_root is not None else default_data_root()
    return _datasets.from_data_root(info, root, download)


def build_model(name: str, dataset: DatasetBundle | DatasetInfo | str, **options: Any) -> nn.Module:
    """A randomly initialised catalog model sized for `dataset` (a bundle, info or name).

    Torchvision models get `num_classes` from the dataset and an input adapter (grayscale ->
    3 channels, small images upsampled to the model's minimum side); see `catalog.models`.

    Raises:
        ValueError: unknown name, option or option value, or a model incompatible with the
            dataset.
    """
    model_info = require_model(name)
    info = _dataset_info(dataset)
    reason = check_compatible(name, info.name)
    if reason:
        raise ValueError(reason)
    configured_model(name, options)  # option names and ranges: what the spec checks at submit
    if model_info.source == "torchvision":
        assert info.image_size is not None
        return _models.build_torchvision(model_info, info.num_classes, info.image_size)
    if name == "tiny_transformer":
        assert info.vocab_size is not None and info.max_seq_len is not None
        return _models.TinyTransformer(info.vocab_size, info.max_seq_len, **options)
    assert info.channels is not None and info.image_size is not None
    if name == "mlp":
        return _models.MLP(info.channels * info.image_size**2, info.num_classes, **options)
    if name == "small_cnn":
        return _models.SmallCNN(info.channels, info.num_classes, **options)
    raise AssertionError(f"catalog model {name!r} has no builder")  # names.py and here disagree


class TokenCrossEntropyLoss(nn.CrossEntropyLoss):
    """Cross-entropy over tokens: flattens (B, T, V) logits and (B, T) targets, ignores -100,
    and returns the mean over the non-ignored tokens (what the trainer's item count expects)."""

    def __init__(self) -> None:
        super().__init__(ignore_index=IGNORE_INDEX, reduction="mean")

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().forward(input.reshape(-1, input.shape[-1]), target.reshape(-1))


def build_loss(dataset: DatasetBundle | DatasetInfo | str) -> nn.Module:
    """Mean-over-items cross-entropy with ignore_index=-100, token-flattening for text."""
    info = _dataset_info(dataset)
    if info.task == "language_modeling":
        return TokenCrossEntropyLoss()
    return nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)


def _dataset_info(dataset: DatasetBundle | DatasetInfo | str) -> DatasetInfo:
    if isinstance(dataset, DatasetBundle):
        return dataset.info
    if isinstance(dataset, DatasetInfo):
        return dataset
    return require_dataset(dataset)

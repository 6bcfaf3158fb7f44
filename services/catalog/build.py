"""Build datasets, models and losses from catalog names (imports torch).

    from services.catalog.build import build_dataset, build_model, build_loss
    bundle = build_dataset("digits")
    model = build_model("small_cnn", bundle)
    loss_fn = build_loss(bundle)
    loader = accumcore.data.make_loader(bundle.train, batch_size=16, collate_fn=bundle.collate_fn)

Unknown names and options raise ValueError listing what is allowed; missing data-root
datasets raise DatasetUnavailable naming the root and the fix. Your own data and the
`timm:`/`hf:`/plugin models are built by `own_data.py` and `own_models.py` (the `models`
extra), imported here only for those names so a worker without the extra serves the catalog.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.catalog import datasets as _datasets
from services.catalog import models as _models
from services.catalog.datasets import DatasetBundle, DatasetUnavailable, default_data_root
from services.catalog.names import DatasetInfo
from services.catalog.plugins import DATASET_GROUP, installed
from services.catalog.served import (
    configured_dataset,
    configured_model,
    mismatch,
    require_dataset,
    require_model,
)
from services.catalog.text import IGNORE_INDEX

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
    if info.source == "plugin":
        return _plugin_dataset(info, Path(data_root) if data_root is not None else None, seed, options)
    if info.source == "own":
        if data_root is None:
            raise ValueError(f"dataset {name!r} needs data_root")
        return _own_dataset(info, Path(data_root), seed, options)
    if name == "digits":
        return _datasets.digits(info)
    if name == "fake":
        return _datasets.fake(info, seed)
    if name == "text":
        return _datasets.text(info)
    root = Path(data_root).expanduser() if data_root is not None else default_data_root()
    return _datasets.from_data_root(info, root, download)


def _own_dataset(info: DatasetInfo, root: Path, seed: int, options: dict[str, Any]) -> DatasetBundle:
    from services.catalog import own_data  # torchvision / datasets / tokenizers: the models extra

    if info.name == "imagefolder":
        train, val, built = own_data.imagefolder(info, root, seed, options)
        return DatasetBundle(train=train, val=val, info=built)
    train, val, built, collate, keyword = own_data.table(info, root, seed, options)
    return DatasetBundle(train=train, val=val, info=built, collate_fn=collate, keyword_collate_fn=keyword)


def _plugin_dataset(info: DatasetInfo, root: Path | None, seed: int, options: dict[str, Any]) -> DatasetBundle:
    """An `accum.datasets` entry point: `fn(data_root=, seed=, **options)` returning a mapping
    with `train`, `val` and `num_classes` (optional: `task`, `collate_fn`, `vocab_size`,
    `channels`, `image_size`, `max_seq_len`)."""
    from dataclasses import replace

    entry = installed(DATASET_GROUP).get(info.name)
    if entry is None:
        raise ValueError(f"plugin dataset {info.name!r} is not installed on this worker")
    built = entry.load()(data_root=root, seed=seed, **options)
    if not isinstance(built, dict) or not {"train", "val", "num_classes"} <= built.keys():
        raise TypeError(
            f"plugin dataset {info.name!r} ({entry.value}) must return a dict with train, val and "
            f"num_classes; got {type(built).__name__}"
        )
    fields = ("task", "vocab_size", "channels", "image_size", "max_seq_len")
    info = replace(info, num_classes=built["num_classes"], train_size=len(built["train"]),
                   val_size=len(built["val"]), **{k: built[k] for k in fields if k in built})
    return DatasetBundle(train=built["train"], val=built["val"], info=info,
                         collate_fn=built.get("collate_fn"))


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
    if model_info.source in ("timm", "hf", "plugin"):
        from services.catalog import own_models  # timm / transformers: the models extra

        builder = {"timm": own_models.build_timm, "hf": own_models.build_hf,
                   "plugin": own_models.build_plugin}[model_info.source]
        return builder(model_info, info, options)
    if model_info.source == "torchvision":
        assert info.image_size is not None and info.num_classes is not None
        return _models.build_torchvision(model_info, info.num_classes, info.image_size)
    if name == "tiny_transformer":
        assert info.vocab_size is not None and info.max_seq_len is not None
        return _models.TinyTransformer(info.vocab_size, info.max_seq_len, **options)
    assert info.num_classes is not None
    if name == "mlp":
        return _models.MLP(math.prod(info.input_shape), info.num_classes, **options)
    if name == "small_cnn":
        assert info.channels is not None
        return _models.SmallCNN(info.channels, info.num_classes, **options)
    raise AssertionError(f"catalog model {name!r} has no builder")  # names.py and here disagree


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
        from services.catalog.own_models import CausalLMLoss

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

"""Dataset constructors behind the catalog's names.

Image datasets yield (float32 image (C, H, W), int64 label); `text` yields variable-length
(ids, next ids) pairs that `pad_collate` pads per batch. Files for mnist, fashion_mnist and
cifar10 are read from a data root and downloaded only when the caller passes download=True.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from services.catalog.builders.text import CharSequences, pad_collate
from services.catalog.contained import check_links
from services.catalog.entries import DatasetInfo
from services.catalog.families.builtin_datasets import DIGITS_VAL_SIZE
from services.catalog.families.plugins import DATASET_GROUP, installed
from services.catalog.text_corpus import split

DIGITS_FILE = "digits.csv.gz"

# The digits split never depends on the job's seed: every job validates on the same 360 images.
DIGITS_SPLIT_SEED = 0

# Per-channel (mean, std) of the training sets, the usual published values.
_NORMALISATION = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
_TORCHVISION_CLASS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "cifar10": "CIFAR10"}
_IDX_FILES = "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte"
# Where torchvision looks under the data root, and for which files.
_EXPECTED_FILES = {
    "mnist": ("MNIST/raw", _IDX_FILES),
    "fashion_mnist": ("FashionMNIST/raw", _IDX_FILES),
    "cifar10": ("cifar-10-batches-py", "data_batch_1 to data_batch_5, test_batch, batches.meta"),
}


class DatasetUnavailable(Exception):
    """A data-root dataset is missing (or its download failed); the message says how to fix it."""

    def __init__(
        self, name: str, data_root: Path, detail: str = "", download_failed: bool = False
    ) -> None:
        self.name = name
        self.data_root = data_root
        folder, files = _EXPECTED_FILES[name]
        # After a failed download, advising `download: true` again would send the user round
        # in a circle (an offline cluster): the files have to be copied in.
        fix = (
            "The worker could not download them: copy the files there from a machine with "
            "network access (torchvision's dataset classes with download=True write this layout)."
            if download_failed
            else 'Put the files there, or set "download": true in the job\'s dataset spec '
            f'(e.g. {{"name": "{name}", "download": true}}) to fetch them once, if the '
            "worker has network access."
        )
        super().__init__(
            f"dataset {name!r} is not available under data root '{data_root}': expected "
            f"{files} in {data_root / folder}. {fix}" + (f" {detail}" if detail else "")
        )


@dataclass(frozen=True)
class DatasetBundle:
    """What a training run needs from a dataset: both splits, how to batch them, and shapes."""

    train: Dataset[Any]
    val: Dataset[Any]
    info: DatasetInfo  # reflects the options used (e.g. fake's image_size)
    collate_fn: Callable[[list[Any]], Any] | None = None  # None: the default collate
    # Token data for a model that takes keyword batches (a Hugging Face model): unshifted
    # labels beside `input_ids` and `attention_mask` (see catalog.own_data.token_collate).
    keyword_collate_fn: Callable[[list[Any]], Any] | None = None


class NormalisedImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """uint8 images (N, H, W) or (N, H, W, C) scaled to [0, 1] and normalised per channel on
    access, so a 60,000-image set stays in memory as bytes."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: tuple[float, ...],
        std: tuple[float, ...],
    ) -> None:
        self.images = images if images.dim() == 4 else images.unsqueeze(-1)
        self.labels = labels.long()
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index].permute(2, 0, 1).float().div_(255)
        return (image - self.mean) / self.std, self.labels[index]


def build_builtin(
    info: DatasetInfo, *, data_root: Path | None, download: bool, seed: int, options: Mapping[str, Any]
) -> DatasetBundle:
    """A built-in dataset; `info` has the options applied (`families/builtin_datasets.py`)."""
    if info.name == "digits":
        return digits(info)
    if info.name == "fake":
        return fake(info, seed)
    if info.name == "text":
        return text(info)
    root = data_root.expanduser() if data_root is not None else default_data_root()
    return from_data_root(info, root, download)


def build_plugin(
    info: DatasetInfo, *, data_root: Path | None, download: bool, seed: int, options: Mapping[str, Any]
) -> DatasetBundle:
    """An `accum.datasets` entry point: `fn(data_root=, seed=, **options)` returning a mapping
    with `train`, `val` and `num_classes` (optional: `task`, `collate_fn`, `vocab_size`,
    `channels`, `image_size`, `max_seq_len`)."""
    entry = installed(DATASET_GROUP).get(info.name)
    if entry is None:
        raise ValueError(f"plugin dataset {info.name!r} is not installed on this worker")
    built = entry.load()(data_root=data_root, seed=seed, **options)
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


def default_data_root() -> Path:
    """`$ACCUM_HOME/data` (ACCUM_HOME defaults to ./.accum), read when a dataset is built."""
    return Path(os.environ.get("ACCUM_HOME", ".accum")) / "data"


@functools.cache
def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 8x8 digits as (images (1797, 64) float64, labels (1797,) int), read-only.

    The file is scikit-learn's `datasets/data/digits.csv.gz` (UCI optical digits, BSD-3 with
    scikit-learn), shipped as package data: 57 KB instead of scikit-learn and scipy on every
    worker; one row per image, 64 pixel values 0..16 then the label. Parsed once per process
    (~50 ms each job of a warm worker otherwise: issue 45); the arrays are read-only, so no
    job can change the next one's copy (`digits` copies them into its tensors).
    """
    with resources.as_file(resources.files("services.catalog").joinpath("data", DIGITS_FILE)) as path:
        table = np.loadtxt(path, delimiter=",")
    images, labels = table[:, :-1], table[:, -1].astype(np.int64)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


def digits(info: DatasetInfo) -> DatasetBundle:
    images, labels = load_digits_arrays()
    order = np.random.RandomState(DIGITS_SPLIT_SEED).permutation(len(labels))
    val_idx, train_idx = order[:DIGITS_VAL_SIZE], order[DIGITS_VAL_SIZE:]
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    # Standardise with the training split's statistics (pixel values 0..16 in the source).
    mean, std = x[train_idx].mean(), x[train_idx].std()
    x = (x - mean) / std
    y = torch.tensor(labels, dtype=torch.long)
    return DatasetBundle(
        train=TensorDataset(x[train_idx], y[train_idx]),
        val=TensorDataset(x[val_idx], y[val_idx]),
        info=info,
    )


def fake(info: DatasetInfo, seed: int) -> DatasetBundle:
    """`info` has the options applied (see catalog.configured_dataset)."""
    from torchvision.datasets import FakeData
    from torchvision.transforms import ToTensor

    assert info.image_size is not None and info.train_size is not None and info.val_size is not None
    size, val_size = info.train_size, info.val_size
    shape = (3, info.image_size, info.image_size)
    # FakeData seeds item i with torch.manual_seed(i + random_offset) (taken modulo 2**32 by
    # the CPU generator). Seed s owns the range [s * total, (s + 1) * total): train first, then
    # val, so splits and seeds never share an image.
    offset = seed * (size + val_size)
    train = FakeData(size, shape, info.num_classes, transform=ToTensor(), random_offset=offset)
    val = FakeData(
        val_size, shape, info.num_classes, transform=ToTensor(), random_offset=offset + size
    )
    return DatasetBundle(train=train, val=val, info=info)


def from_data_root(info: DatasetInfo, data_root: Path, download: bool) -> DatasetBundle:
    import torchvision.datasets

    cls = getattr(torchvision.datasets, _TORCHVISION_CLASS[info.name])
    # CIFAR-10's batches are unpickled: a link out of the data root must not reach them.
    check_links(data_root, f"{info.name} file", under=_EXPECTED_FILES[info.name][0].split("/")[0])
    try:
        splits = [cls(str(data_root), train=train, download=download) for train in (True, False)]
    except RuntimeError as exc:  # torchvision's "Dataset not found" and failed downloads
        detail = f"(download failed: {exc})" if download else ""
        raise DatasetUnavailable(info.name, data_root, detail, download_failed=download) from exc
    except OSError as exc:  # network errors during download, unreadable root
        raise DatasetUnavailable(
            info.name, data_root, f"({type(exc).__name__}: {exc})", download_failed=download
        ) from exc
    mean, std = _NORMALISATION[info.name]
    train, val = (
        NormalisedImages(torch.as_tensor(s.data), torch.as_tensor(s.targets), mean, std)
        for s in splits
    )
    info = replace(info, train_size=len(train), val_size=len(val))
    return DatasetBundle(train=train, val=val, info=info)


def text(info: DatasetInfo) -> DatasetBundle:
    """`info` has the options applied (see catalog.configured_dataset)."""
    assert info.max_seq_len is not None
    train_pieces, val_pieces = split(info.max_seq_len)
    return DatasetBundle(
        train=CharSequences(train_pieces),
        val=CharSequences(val_pieces),
        info=info,
        collate_fn=pad_collate,
    )

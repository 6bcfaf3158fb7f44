"""The built-in datasets: `digits` and `text` (shipped), `fake` (generated), and `mnist`,
`fashion_mnist`, `cifar10` (torchvision's, from a data root) (torch-free).

`configure` applies options to sizes and shapes without torch, so the API sizes epochs for
e.g. `{"name": "fake", "size": 256}` exactly as `datasets.build_builtin` builds them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from services.catalog.entries import Compatible, DatasetFamily, DatasetInfo
from services.catalog.option_types import integer_in, undeclared
from services.catalog.text_corpus import TEXT_DEFAULT_MAX_LEN, corpus_stats

# Dataset options: sizes in samples, image side in pixels, sequence length in tokens.
DATASET_OPTION_RANGE: dict[str, tuple[int, int]] = {
    "size": (1, 10_000_000),
    "val_size": (1, 1_000_000),
    "image_size": (1, 1024),
    "num_classes": (2, 100_000),
    "max_len": (2, 4096),
}

# The 8x8 digits shipped as package data (scikit-learn's copy, services/catalog/data): 1797
# images; a fixed 20% (rounded up) goes to validation.
DIGITS_TOTAL = 1797
DIGITS_VAL_SIZE = 360

_text_stats = corpus_stats(TEXT_DEFAULT_MAX_LEN)


def _torchvision_images(name: str, description: str, *, train_size: int, channels: int, image_size: int) -> DatasetInfo:
    """A torchvision image set read from the data root: 10 classes, 10,000 test images."""
    return DatasetInfo(name=name, description=description, task="classification", num_classes=10,
                       train_size=train_size, val_size=10000, channels=channels, image_size=image_size,
                       needs_data_root=True)


BUILTIN_DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(
        name="digits",
        description="8x8 handwritten digits shipped with accum (scikit-learn's copy; real data, offline), fixed split.",
        task="classification",
        num_classes=10,
        train_size=DIGITS_TOTAL - DIGITS_VAL_SIZE,
        val_size=DIGITS_VAL_SIZE,
        channels=1,
        image_size=8,
    ),
    "fake": DatasetInfo(
        name="fake",
        description="torchvision FakeData: deterministic random 3x32x32 images and labels.",
        task="classification",
        num_classes=10,
        train_size=1024,
        val_size=256,
        channels=3,
        image_size=32,
        options=("size", "val_size", "image_size", "num_classes"),
    ),
    "mnist": _torchvision_images(
        "mnist", "MNIST handwritten digits, 28x28 grayscale (torchvision, from the data root).",
        train_size=60000, channels=1, image_size=28,
    ),
    "fashion_mnist": _torchvision_images(
        "fashion_mnist", "Fashion-MNIST clothing images, 28x28 grayscale (torchvision, from the data root).",
        train_size=60000, channels=1, image_size=28,
    ),
    "cifar10": _torchvision_images(
        "cifar10", "CIFAR-10 colour images, 32x32, 10 classes (torchvision, from the data root).",
        train_size=50000, channels=3, image_size=32,
    ),
    "text": DatasetInfo(
        name="text",
        description=(
            "Alice in Wonderland ch. I-III (public domain): one token per character, "
            "sentences of varying length, padding targets -100."
        ),
        task="language_modeling",
        num_classes=_text_stats.vocab_size,
        train_size=_text_stats.train_size,
        val_size=_text_stats.val_size,
        vocab_size=_text_stats.vocab_size,
        max_seq_len=TEXT_DEFAULT_MAX_LEN,
        options=("max_len",),
    ),
}


def configure(info: DatasetInfo, options: dict[str, Any]) -> DatasetInfo:
    """The entry with `options` applied (sizes, shapes, classes); ValueError when refused."""
    name = info.name
    if reason := undeclared("dataset", name, options, info.options):
        raise ValueError(reason)

    def option(key: str, default: int) -> int:
        return integer_in("dataset", name, key, options.get(key, default), *DATASET_OPTION_RANGE[key])

    if name == "fake":
        assert info.image_size is not None and info.num_classes is not None
        assert info.train_size is not None and info.val_size is not None
        return replace(
            info,
            train_size=option("size", info.train_size),
            val_size=option("val_size", info.val_size),
            image_size=option("image_size", info.image_size),
            num_classes=option("num_classes", info.num_classes),
        )
    if name == "text":
        assert info.max_seq_len is not None
        max_len = option("max_len", info.max_seq_len)
        stats = corpus_stats(max_len)
        return replace(
            info, train_size=stats.train_size, val_size=stats.val_size, max_seq_len=max_len
        )
    return info


def listing(compatible: Compatible) -> list[dict[str, Any]]:
    return [info.listing_item(compatible(info.name)) for info in BUILTIN_DATASETS.values()]


FAMILY = DatasetFamily(
    source="builtin", naming="catalog", names=BUILTIN_DATASETS.keys, find=BUILTIN_DATASETS.get,
    configure=configure, listing=listing, builder="services.catalog.builders.datasets:build_builtin",
)

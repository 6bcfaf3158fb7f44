"""Catalog datasets: fixed splits, deterministic fake data, padded text with varying token
counts, data-root datasets read from a (tiny, handmade) root, and clear errors when absent."""

from __future__ import annotations

import struct
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch

import services.catalog
from accumcore.data import make_loader
from services.catalog import DATASETS, configured_dataset
from services.catalog.build import DatasetUnavailable, build_dataset, build_loss, build_model
from services.catalog.text_corpus import CORPUS_FILE, PAD_ID, corpus_text, vocabulary


def test_digits_split_is_fixed_sized_and_independent_of_the_seed() -> None:
    first, second = build_dataset("digits", seed=0), build_dataset("digits", seed=123)
    assert (len(first.train), len(first.val)) == (
        DATASETS["digits"].train_size,
        DATASETS["digits"].val_size,
    )
    for a, b in ((first.train, second.train), (first.val, second.val)):
        assert all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors, strict=True))
    train_rows = {tuple(row.flatten().tolist()) for row in first.train.tensors[0]}
    val_rows = [tuple(row.flatten().tolist()) for row in first.val.tensors[0]]
    # Disjoint up to exact duplicates in the source data (a handful of identical images).
    assert sum(row in train_rows for row in val_rows) < 10
    assert set(first.val.tensors[1].tolist()) == set(range(10))
    assert first.train[0][0].shape == DATASETS["digits"].input_shape
    assert first.train[0][0].dtype == torch.float32


def test_fake_data_is_deterministic_per_seed_and_honours_options() -> None:
    a, b, c = (build_dataset("fake", seed=s, size=4, val_size=2) for s in (0, 0, 1))
    assert torch.equal(a.train[3][0], b.train[3][0]) and a.train[3][1] == b.train[3][1]
    assert not torch.equal(a.train[3][0], c.train[3][0])
    assert not torch.equal(a.train[0][0], a.val[0][0])
    assert (len(a.train), len(a.val)) == (4, 2) and a.info.train_size == 4
    small = build_dataset("fake", image_size=8, num_classes=3, size=2, val_size=1)
    assert small.train[0][0].shape == (3, 8, 8) and small.info.num_classes == 3
    assert build_model("mlp", small)(small.train[0][0][None]).shape == (1, 3)
    with pytest.raises(ValueError, match="option size must be an integer from 1 to 10000000; got 0"):
        build_dataset("fake", size=0)


def test_text_batches_have_varying_valid_token_counts_and_ignored_padding() -> None:
    bundle = build_dataset("text")
    assert (len(bundle.train), len(bundle.val)) == (
        DATASETS["text"].train_size,
        DATASETS["text"].val_size,
    )
    loader = make_loader(bundle.train, batch_size=4, seed=0, collate_fn=bundle.collate_fn)
    counts = []
    for inputs, targets in loader:
        valid = targets != -100
        counts.append(int(valid.sum()))
        # Real tokens form a prefix of each row; padding inputs are PAD_ID, padding targets -100.
        lengths = valid.sum(dim=1)
        positions = torch.arange(targets.shape[1])
        assert torch.equal(valid, positions[None, :] < lengths[:, None])
        assert (inputs[~valid] == PAD_ID).all() and (inputs[valid] != PAD_ID).all()
        assert inputs.shape[1] <= DATASETS["text"].max_seq_len
    assert len(set(counts)) > len(counts) // 2  # counts differ from batch to batch
    assert DATASETS["text"].vocab_size == len(vocabulary()) + 1


def test_text_targets_are_the_next_character() -> None:
    bundle = build_dataset("text")
    inputs, targets = bundle.train[0]
    assert torch.equal(inputs[1:], targets[:-1])
    chars = vocabulary()
    decoded = "".join(chars[i - 1] for i in [*inputs.tolist(), targets[-1].item()])
    assert decoded in " ".join(corpus_text().split())


def test_text_corpus_is_tens_of_kilobytes() -> None:
    assert 20_000 < len(corpus_text()) < 200_000


def test_text_corpus_is_package_data_of_services() -> None:
    """An installed (non-editable) package has only the files package-data names: the corpus
    is read through importlib.resources from `services.catalog`, so `services` must list it."""
    root = Path(__file__).resolve().parents[2]
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    corpus = Path(services.catalog.__file__).parent / "data" / CORPUS_FILE
    assert corpus.is_file()
    relative = corpus.relative_to(Path(services.__file__).parent).as_posix()
    assert any(fnmatch(relative, pattern) for pattern in package_data["services"]), relative
    assert "accumcore" not in package_data


def test_text_max_len_option_bounds_sequence_length() -> None:
    bundle = build_dataset("text", max_len=16)
    assert max(len(bundle.train[i][0]) for i in range(len(bundle.train))) == 16
    assert bundle.info.max_seq_len == 16 and len(bundle.train) > DATASETS["text"].train_size
    assert build_model("tiny_transformer", bundle).max_len == 16


def test_token_loss_is_the_mean_over_non_padding_tokens() -> None:
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, 2, -100], [3, -100, -100]])
    expected = torch.nn.functional.cross_entropy(logits[targets != -100], targets[targets != -100])
    loss_fn = build_loss("text")
    assert torch.allclose(loss_fn(logits, targets), expected)
    assert loss_fn.reduction == "mean" and loss_fn.ignore_index == -100


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10"])
def test_missing_data_root_dataset_names_the_root_and_the_fix(name: str, tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailable) as excinfo:
        build_dataset(name, data_root=tmp_path / "data")
    message = str(excinfo.value)
    assert str(tmp_path / "data") in message
    assert '"download": true' in message and "Put the files there" in message
    assert excinfo.value.data_root == tmp_path / "data"
    assert not (tmp_path / "data").exists()  # nothing was downloaded or created


def test_a_failed_download_does_not_advise_downloading_again(tmp_path: Path) -> None:
    # No network here (and none on an offline cluster): the download itself fails.
    with pytest.raises(DatasetUnavailable) as excinfo:
        build_dataset("mnist", data_root=tmp_path / "data", download=True)
    message = str(excinfo.value)
    assert "could not download" in message and "copy the files there" in message
    assert '"download": true' not in message and str(tmp_path / "data") in message


def test_default_data_root_is_under_accum_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCUM_HOME", str(tmp_path))
    with pytest.raises(DatasetUnavailable, match=str(tmp_path / "data")):
        build_dataset("mnist")


def write_idx(path: Path, array: torch.Tensor) -> None:
    """MNIST's idx format: magic (0, 0, type ubyte=8, ndim), big-endian dims, raw bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">BBBB", 0, 0, 8, array.dim()) + struct.pack(
        f">{array.dim()}I", *array.shape
    )
    path.write_bytes(header + array.to(torch.uint8).numpy().tobytes())


@pytest.mark.parametrize(
    ("name", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")]
)
def test_data_root_dataset_reads_files_from_the_root(
    name: str, folder: str, tmp_path: Path
) -> None:
    generator = torch.Generator().manual_seed(0)
    raw = tmp_path / folder / "raw"
    for prefix, n in (("train", 6), ("t10k", 4)):
        write_idx(
            raw / f"{prefix}-images-idx3-ubyte",
            torch.randint(0, 256, (n, 28, 28), generator=generator),
        )
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", torch.arange(n) % 10)
    bundle = build_dataset(name, data_root=tmp_path)
    assert (len(bundle.train), len(bundle.val)) == (6, 4)
    image, label = bundle.train[3]
    assert image.shape == DATASETS[name].input_shape and image.dtype == torch.float32
    assert label.item() == 3
    inputs, targets = next(iter(make_loader(bundle.train, batch_size=2, seed=0)))
    model = build_model("small_cnn", bundle)
    build_loss(bundle)(model(inputs), targets).backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("digits", {}),
        ("fake", {"size": 8, "val_size": 3, "image_size": 5}),
        ("text", {"max_len": 40}),
    ],
)
def test_bundle_info_is_what_the_torch_free_catalog_predicts(name: str, options: dict) -> None:
    bundle = build_dataset(name, **options)
    assert bundle.info == configured_dataset(name, options)
    assert (len(bundle.train), len(bundle.val)) == (bundle.info.train_size, bundle.info.val_size)
    assert bundle.train[0][0].shape[-1] == bundle.info.input_shape[-1] or name == "text"


def test_unknown_dataset_and_option_raise_value_error() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'.*cifar10"):
        build_dataset("imagenet")
    with pytest.raises(ValueError, match="accepted options: none"):
        build_dataset("digits", image_size=16)

"""imagefolder, files and hf_disk: splits, transforms, targets known without decoding images,
text tokenised (bytes or a trained tokenizer) and packed or padded, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accumcore.data import make_loader
from accumcore.window_source import reads_window_ahead
from services.catalog.build import build_dataset
from tests.own_data_files import (
    CLASS_WORDS,
    CLASSES,
    SENTENCES,
    make_image_folder,
    train_tokenizer,
    write_labelled_text,
    write_text,
)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("images"), per_class=5, size=12)


def test_imagefolder_split_by_seed_with_targets_known(folder: Path) -> None:
    bundle = build_dataset("imagefolder", data_root=folder, seed=3, image_size=16, val_fraction=0.2)
    assert bundle.info.num_classes == len(CLASSES) and (bundle.info.train_size, bundle.info.val_size) == (12, 3)
    image, label = bundle.train[0]
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    assert bundle.train.targets == [bundle.train[i][1] for i in range(12)]  # type: ignore[attr-defined]
    again = build_dataset("imagefolder", data_root=folder, seed=3, image_size=16, val_fraction=0.2)
    other = build_dataset("imagefolder", data_root=folder, seed=4, image_size=16, val_fraction=0.2)
    assert again.val.indices == bundle.val.indices != other.val.indices  # type: ignore[attr-defined]
    # The trainer counts a window's items from `targets`, without decoding the images.
    assert not reads_window_ahead(make_loader(bundle.train, 4))


def test_imagefolder_train_and_val_folders(tmp_path: Path) -> None:
    make_image_folder(tmp_path, per_class=4, size=8, split=True)
    bundle = build_dataset("imagefolder", data_root=tmp_path, image_size=8, random_resized_crop=True,
                           horizontal_flip=True, mean=[0.5], std=[0.25])
    assert (bundle.info.train_size, bundle.info.val_size) == (12, 6)
    assert bundle.train[0][0].shape == (3, 8, 8)


def test_imagefolder_without_class_folders_says_the_layout(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one sub-folder per class"):
        build_dataset("imagefolder", data_root=tmp_path, image_size=8)


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "csv"])
def test_text_files_packed_into_blocks(tmp_path: Path, kind: str) -> None:
    name = write_text(tmp_path, kind)
    bundle = build_dataset("files", data_root=tmp_path, data_files=name, columns={"text": "body"},
                           tokenizer="bytes", max_len=16, val_fraction=0.25)
    assert bundle.info.vocab_size == 256 and bundle.info.task == "language_modeling"
    total = sum(len(s.encode()) + 1 for s in SENTENCES)  # one separator per document
    train = [bundle.train[i] for i in range(len(bundle.train))]
    val = [bundle.val[i] for i in range(len(bundle.val))]
    assert all(len(r) == 16 for r in train[:-1] + val[:-1])  # each split's last block is short
    assert sum(len(r) for r in train + val) == total
    inputs, targets = bundle.collate_fn([bundle.train[0], bundle.train[1]])
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # the plain form is pre-shifted
    keyword = bundle.keyword_collate_fn([bundle.train[0], bundle.train[1]])
    assert set(keyword["inputs"]) == {"input_ids", "attention_mask"} and torch.equal(keyword["targets"], keyword["inputs"]["input_ids"])


def test_padding_marks_labels_ignored(tmp_path: Path) -> None:
    write_text(tmp_path, "jsonl")
    bundle = build_dataset("files", data_root=tmp_path, data_files="text.jsonl", columns={"text": "body"},
                           tokenizer="bytes", max_len=64, packing=False)
    rows = [bundle.train[0], bundle.train[1]]
    batch = bundle.keyword_collate_fn(rows)
    lengths = [len(r) for r in rows]
    assert batch["inputs"]["attention_mask"].sum(1).tolist() == lengths
    assert (batch["targets"] == -100).sum().item() == 2 * max(lengths) - sum(lengths)


def test_trained_tokenizer_and_train_val_files(tmp_path: Path) -> None:
    train_tokenizer(tmp_path / "tok")
    write_text(tmp_path / "a", "jsonl")
    write_text(tmp_path / "b", "jsonl")
    bundle = build_dataset("files", data_root=tmp_path, data_files={"train": "a/text.jsonl", "val": "b/text.jsonl"},
                           columns={"text": "body"}, tokenizer="tok", max_len=8)
    assert bundle.info.vocab_size == 120 and len(bundle.train) == len(bundle.val)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        build_dataset("files", data_root=tmp_path, data_files="a/text.jsonl", columns={"text": "body"}, tokenizer="a")


def test_missing_column_lists_the_columns(tmp_path: Path) -> None:
    write_text(tmp_path, "parquet")
    with pytest.raises(ValueError, match=r"column\(s\) text not in the data; its columns: body, id"):
        build_dataset("files", data_root=tmp_path, data_files="text.parquet", tokenizer="bytes")
    with pytest.raises(ValueError, match="no file at"):
        build_dataset("files", data_root=tmp_path, data_files="nope.jsonl", tokenizer="bytes")


def test_feature_columns_and_hf_disk(tmp_path: Path) -> None:
    import datasets

    rows = [{"x": float(i % 3), "y": float(i), "kind": "abc"[i % 3]} for i in range(30)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    bundle = build_dataset("hf_disk", data_root=tmp_path / "saved", seed=1,
                           columns={"features": ["x", "y"], "label": "kind"})
    assert bundle.info.num_classes == 3 and bundle.info.input_shape == (2,)
    features, label = bundle.train[0]
    assert features.shape == (2,) and int(label) == "abc".index("abc"[int(features[0])])


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_text_and_label_give_one_padded_row_and_label_per_document(tmp_path: Path, kind: str) -> None:
    name = write_labelled_text(tmp_path, kind, rows=20)
    bundle = build_dataset("files", data_root=tmp_path, data_files=name, columns={"text": "body", "label": "y"},
                           tokenizer="bytes", max_len=16, val_fraction=0.25)
    info = bundle.info
    assert (info.task, info.num_classes, info.train_size, info.val_size) == ("classification", 3, 15, 5)
    # Bytes have no padding token: the padding id is a new one after the 256 bytes.
    assert (info.pad_token_id, info.vocab_size, info.max_seq_len) == (256, 257, 16)
    assert bundle.keyword_collate_fn is None  # one form: keyword inputs and one label per row
    rows = [bundle.train[i] for i in range(4)]
    assert [label for _, label in rows] == bundle.train.targets[:4]  # type: ignore[attr-defined]
    assert all(0 < len(ids) <= 16 and int(ids.max()) < 256 for ids, _ in rows)
    batch = bundle.collate_fn(rows)
    lengths = [len(ids) for ids, _ in rows]
    assert batch["targets"].tolist() == [label for _, label in rows]
    assert batch["inputs"]["attention_mask"].sum(1).tolist() == lengths
    assert (batch["inputs"]["input_ids"] == 256).sum().item() == 4 * max(lengths) - sum(lengths)
    words = {word: c for c, ws in enumerate(sorted(CLASS_WORDS)) for word in CLASS_WORDS[ws]}
    text = bytes(rows[0][0].tolist()).decode()
    assert words[text.split()[0]] == rows[0][1]  # class names numbered in sorted order


def test_a_tokenizer_with_a_pad_token_pads_with_it(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    words = [w for ws in CLASS_WORDS.values() for w in ws]
    tokenizer.train_from_iterator(words, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    (tmp_path / "tok").mkdir()
    tokenizer.save(str(tmp_path / "tok" / "tokenizer.json"))
    write_labelled_text(tmp_path, "jsonl", rows=12)
    bundle = build_dataset("files", data_root=tmp_path, data_files="labelled.jsonl", tokenizer="tok",
                           columns={"text": "body", "label": "y"})
    assert bundle.info.pad_token_id == 0 and bundle.info.vocab_size == tokenizer.get_vocab_size()


def test_empty_text_is_refused_naming_the_rows(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"body": "apple", "y": 0}\n{"body": "", "y": 1}\n' * 5)
    with pytest.raises(ValueError, match=r"row\(s\) .* have empty text"):
        build_dataset("files", data_root=tmp_path, data_files="t.jsonl", tokenizer="bytes",
                      columns={"text": "body", "label": "y"}, val_fraction=0.5)


def test_hf_disk_text_and_label_with_its_own_val_split(tmp_path: Path) -> None:
    import datasets

    rows = [{"body": "apple almond", "y": 0}, {"body": "berry", "y": 1}, {"body": "cherry coconut cherry", "y": 2}]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows * 3),
                          "validation": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "saved"))
    bundle = build_dataset("hf_disk", data_root=tmp_path / "saved", columns={"text": "body", "label": "y"},
                           tokenizer="bytes", max_len=8)
    assert (bundle.info.task, bundle.info.num_classes, len(bundle.train), len(bundle.val)) == ("classification", 3, 9, 3)
    assert [len(ids) for ids, _ in (bundle.val[i] for i in range(3))] == [8, 5, 8]  # cut to max_len

"""Your own data as torch datasets: `imagefolder`, `files` (parquet/jsonl/csv) and `hf_disk`.

- imagefolder: torchvision `ImageFolder` (class sub-folders; `train/` and `val/` when both
  exist, else a `val_fraction` split drawn from the seed). Each split keeps a `targets` list,
  so the trainer counts a window's items from it without decoding images
  (`accumcore.window_source`).
- files / hf_disk: rows through Hugging Face `datasets`, a column mapping, then text tokenised
  (`tokenizer: "bytes"` or a `tokenizers` directory) and packed into `max_len` blocks (the
  last one padded) or one padded row per document; with a label column, one padded row per
  document and its label (sequence classification, `label_collate`); classification from an
  image or feature columns and a label column.

Token batches come in two forms (`token_collate`): a Hugging Face model gets keyword inputs
`{"inputs": {"input_ids", "attention_mask"}, "targets": labels}` with unshifted labels (the
loss shifts, the trainer counts `labels[..., 1:]`); any other model gets `(ids[:, :-1],
labels[:, 1:])`, the catalog's `text` form. Padding labels are -100 either way.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from services.catalog.builders.datasets import DatasetBundle
from services.catalog.builders.text import IGNORE_INDEX
from services.catalog.contained import check_links, inside
from services.catalog.entries import DatasetInfo
from services.catalog.families.own_data import DEFAULT_IMAGE_SIZE, DEFAULT_MAX_LEN, columns_of

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
DEFAULT_VAL_FRACTION = {"imagefolder": 0.2, "files": 0.1, "hf_disk": 0.1}
BYTE_VOCAB = 256
_SUFFIX_FORMAT = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")
_PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>")


class Labelled(Dataset[Any]):
    """Items of `base` at `indices`, with their `targets` known without loading the items."""

    def __init__(self, base: Any, indices: Sequence[int], targets: Sequence[int]) -> None:
        self.base = base
        self.indices = list(indices)
        self.targets = [int(targets[i]) for i in self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.base[self.indices[index]]


def build(
    info: DatasetInfo, *, data_root: Path | None, download: bool, seed: int, options: Mapping[str, Any]
) -> DatasetBundle:
    """Your own data under `data_root`; `info` has the options applied (`families/own_data.py`)."""
    if data_root is None:
        raise ValueError(f"dataset {info.name!r} needs data_root")
    if info.name == "imagefolder":
        train, val, built = imagefolder(info, data_root, seed, options)
        return DatasetBundle(train=train, val=val, info=built)
    train, val, built, collate, keyword = table(info, data_root, seed, options)
    return DatasetBundle(train=train, val=val, info=built, collate_fn=collate, keyword_collate_fn=keyword)


def split_indices(size: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) indices: a permutation drawn from `seed`, val first, at least one each."""
    if size < 2:
        raise ValueError(f"the data has {size} rows; at least 2 are needed to split off validation")
    order = list(range(size))
    random.Random(seed).shuffle(order)
    val = min(max(1, round(size * val_fraction)), size - 1)
    return sorted(order[val:]), sorted(order[:val])


def image_transforms(options: Mapping[str, Any]) -> tuple[Any, Any]:
    """(train, val) transforms: resize (or random resized crop), flip, to tensor, normalise."""
    from torchvision import transforms as T

    size = int(options.get("image_size", DEFAULT_IMAGE_SIZE))
    normalise = T.Normalize(options.get("mean", IMAGENET_MEAN), options.get("std", IMAGENET_STD))
    first = T.RandomResizedCrop(size) if options.get("random_resized_crop") else T.Resize((size, size))
    flip = [T.RandomHorizontalFlip()] if options.get("horizontal_flip") else []
    rgb = T.Lambda(lambda image: image.convert("RGB"))
    train = T.Compose([rgb, first, *flip, T.ToTensor(), normalise])
    val = T.Compose([rgb, T.Resize((size, size)), T.ToTensor(), normalise])
    return train, val


def imagefolder(info: DatasetInfo, root: Path, seed: int, options: Mapping[str, Any]) -> tuple[Dataset[Any], Dataset[Any], DatasetInfo]:
    from torchvision.datasets import ImageFolder

    if not root.is_dir():
        raise ValueError(f"dataset 'imagefolder': data_root {root} is not a directory")
    check_links(root, "image folder entry")  # ImageFolder follows every link it meets
    train_tf, val_tf = image_transforms(options)
    try:
        if (root / "train").is_dir() and (root / "val").is_dir():
            train_set = ImageFolder(str(root / "train"), transform=train_tf)
            val_set = ImageFolder(str(root / "val"), transform=val_tf)
            if val_set.classes != train_set.classes:
                raise ValueError(
                    f"dataset 'imagefolder': {root}/val has classes {val_set.classes} but "
                    f"{root}/train has {train_set.classes}; give both the same class folders"
                )
            train: Dataset[Any] = train_set
            val: Dataset[Any] = val_set
            classes = train_set.classes
        else:
            plain = ImageFolder(str(root), transform=train_tf)
            shown = ImageFolder(str(root), transform=val_tf)
            fraction = float(options.get("val_fraction", DEFAULT_VAL_FRACTION["imagefolder"]))
            train_idx, val_idx = split_indices(len(plain), fraction, seed)
            train, val = Labelled(plain, train_idx, plain.targets), Labelled(shown, val_idx, shown.targets)
            classes = plain.classes
    except FileNotFoundError as exc:  # no class folder, or a class folder without images
        raise ValueError(
            f"dataset 'imagefolder' at {root}: {exc}. Expected one sub-folder per class "
            "(data_root/<class>/<image>), or data_root/train/<class>/ and data_root/val/<class>/"
        ) from exc
    size = int(options.get("image_size", DEFAULT_IMAGE_SIZE))
    info = replace(info, num_classes=len(classes), train_size=len(train), val_size=len(val),  # type: ignore[arg-type]
                   channels=3, image_size=size)
    return train, val, info


# --- files and hf_disk ----------------------------------------------------------------------

def load_rows(name: str, root: Path, options: Mapping[str, Any]) -> tuple[Any, Any | None]:
    """(train rows, val rows or None) as Hugging Face `datasets.Dataset`s."""
    import datasets

    datasets.disable_progress_bars()  # a worker's log is not a terminal
    if name == "hf_disk":
        check_links(root, "saved dataset file")
        check_saved_references(root)
        try:
            loaded = datasets.load_from_disk(str(root))
        except FileNotFoundError as exc:
            raise ValueError(f"dataset 'hf_disk': no dataset saved with save_to_disk at {root} ({exc})") from exc
        except Exception as exc:  # noqa: BLE001 - the reader's message may quote the file
            raise unreadable("hf_disk", "a dataset saved with save_to_disk", exc) from None
        if isinstance(loaded, datasets.DatasetDict):
            val_name = next((s for s in ("val", "validation", "test") if s in loaded), None)
            train_name = "train" if "train" in loaded else next(iter(loaded))
            return loaded[train_name], loaded[val_name] if val_name else None
        return loaded, None
    spec = options["data_files"]
    parts = spec if isinstance(spec, Mapping) else {"train": spec}
    files = {split: [str(inside(root, f, "data file")) for f in (p if isinstance(p, list) else [p])]
             for split, p in parts.items()}
    every = [f for group in files.values() for f in group]
    missing = [f for f in every if not Path(f).is_file()]
    if missing:
        raise ValueError(f"dataset 'files': no file at {', '.join(missing)} (data_files are relative to data_root {root})")
    fmt = options.get("format") or _SUFFIX_FORMAT.get(Path(every[0]).suffix)
    if fmt is None:
        raise ValueError(
            f"dataset 'files': cannot tell the format of {every[0]} from its suffix; set format to one of "
            "parquet, json, csv (suffixes .parquet, .jsonl, .json, .csv are known)"
        )
    try:
        loaded = datasets.load_dataset(fmt, data_files=files)
    except Exception as exc:  # noqa: BLE001 - a parse error quotes the line it failed on
        raise unreadable("files", f"{fmt} (format)", exc) from None
    return loaded["train"], loaded.get("val")


def unreadable(name: str, expected: str, exc: Exception) -> ValueError:
    """The reader's failure without its message: a CSV or JSON parse error quotes the line it
    failed on, and the file's content must never reach a job's error or events (the worker
    records both). `from None` keeps the original out of the traceback event too."""
    return ValueError(
        f"dataset {name!r}: the data could not be read as {expected} ({type(exc).__name__}; the "
        "reader's message is not shown, as it can quote the file). Check the file with the same "
        "reader locally, e.g. datasets.load_dataset or load_from_disk"
    )


def check_saved_references(root: Path) -> None:
    """The files a `save_to_disk` directory names in its JSON (`dataset_dict.json` splits,
    `state.json` data files) lie inside it: `load_from_disk` joins them as they are."""
    import json

    def names(path: Path, key: str) -> list[Any]:
        try:
            value = json.loads(path.read_text("utf-8")).get(key, [])
        except (OSError, ValueError, AttributeError):
            return []  # absent or malformed: load_from_disk refuses it (its message is not shown)
        return value if isinstance(value, list) else []

    splits = [inside(root, str(split), "split") for split in names(root / "dataset_dict.json", "splits")]
    for directory in splits or [Path(root)]:
        for data_file in names(directory / "state.json", "_data_files"):
            filename = data_file.get("filename") if isinstance(data_file, Mapping) else None
            inside(directory, str(filename), "saved data file")


def require_columns(rows: Any, columns: Mapping[str, Any], name: str) -> None:
    wanted = [c for role, c in columns.items() for c in ([c] if isinstance(c, str) else c)]
    missing = [c for c in wanted if c not in rows.column_names]
    if missing:
        raise ValueError(
            f"dataset {name!r}: column(s) {', '.join(missing)} not in the data; its columns: "
            f"{', '.join(rows.column_names)} (set columns, e.g. {{\"text\": \"{rows.column_names[0]}\"}})"
        )


class Tokenizer:
    """`bytes` (UTF-8 bytes as ids, 256 of them, no files) or a `tokenizers` tokenizer file."""

    def __init__(self, spec: str, root: Path) -> None:
        if spec == "bytes":
            self._tok = None
            self.vocab_size = BYTE_VOCAB
            self.eos: int | None = 10  # a newline between documents
            self.pad: int | None = None
            return
        import tokenizers  # noqa: F401  (not installed: the ImportError here, not in the parse below)

        path = inside(root, spec, "tokenizer")
        file = inside(root, path / "tokenizer.json", "tokenizer") if path.is_dir() else path
        if not file.is_file():
            raise ValueError(
                f"tokenizer {spec!r}: no tokenizer.json at {root / spec} (save one with tokenizers' "
                'Tokenizer.save or a transformers tokenizer\'s save_pretrained), or use tokenizer: "bytes"'
            )
        try:
            stat = file.stat()
            self._tok = tokenizer_file(str(file.resolve()), stat.st_mtime_ns, stat.st_size)
        except Exception as exc:  # noqa: BLE001 - the parser's message may quote the file
            raise ValueError(
                f"tokenizer {spec!r}: not a tokenizers tokenizer.json ({type(exc).__name__}; the message "
                "is not shown, as it can quote the file); save one with Tokenizer.save"
            ) from None
        self.vocab_size = self._tok.get_vocab_size()
        self.eos = next((i for n in _EOS_NAMES if (i := self._tok.token_to_id(n)) is not None), None)
        self.pad = next((i for n in _PAD_NAMES if (i := self._tok.token_to_id(n)) is not None), None)

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self._tok is None:
            return [list(text.encode("utf-8")) for text in texts]
        return [e.ids for e in self._tok.encode_batch(texts)]


@functools.lru_cache(maxsize=8)
def tokenizer_file(path: str, mtime_ns: int, size: int) -> Any:
    """A `tokenizers` tokenizer.json, parsed once per process while the file is unchanged (its
    modification time and size are the key): a warm worker's next job on the same data reuses
    it (issue 45). Encoding does not change a tokenizer, so jobs share it."""
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer.from_file(path)


class TokenRows(Dataset[torch.Tensor]):
    """Token id rows: fixed `max_len` blocks (packing) or one truncated document each."""

    def __init__(self, rows: list[list[int]], max_len: int, packing: bool, eos: int | None) -> None:
        if packing:
            stream = [t for row in rows for t in (row + [eos] if eos is not None else row)]
            rows = [stream[i:i + max_len] for i in range(0, len(stream), max_len)]
        self.rows = [torch.tensor(r[:max_len], dtype=torch.long) for r in rows if len(r) >= 2]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.rows[index]


def token_collate(keyword: bool) -> Callable[[list[torch.Tensor]], Any]:
    """Pads rows to the batch's longest: labels -100 and attention 0 on padding."""

    def collate(rows: list[torch.Tensor]) -> Any:
        length = max(int(r.shape[0]) for r in rows)
        ids = torch.zeros((len(rows), length), dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : row.shape[0]] = row
            labels[i, : row.shape[0]] = row
            mask[i, : row.shape[0]] = 1
        if keyword:
            return {"inputs": {"input_ids": ids, "attention_mask": mask}, "targets": labels}
        return ids[:, :-1], labels[:, 1:]

    return collate


class LabelledText(Dataset[tuple[torch.Tensor, int]]):
    """(token ids of one document, cut to `max_len`; its label), `targets` known without tokens."""

    def __init__(self, rows: list[list[int]], labels: list[int], max_len: int, split: str) -> None:
        empty = [i for i, row in enumerate(rows) if not row]
        if empty:
            raise ValueError(
                f"{split} row(s) {', '.join(map(str, empty[:10]))} have empty text: a sequence "
                "classifier needs at least one token per row; drop or fill them"
            )
        self.rows = [torch.tensor(row[:max_len], dtype=torch.long) for row in rows]
        self.targets = labels

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.rows[index], self.targets[index]


def label_collate(pad_id: int) -> Callable[[list[tuple[torch.Tensor, int]]], Any]:
    """Rows padded (right) with `pad_id` to the batch's longest, attention 0 on padding, one
    label per row: `{"inputs": {"input_ids", "attention_mask"}, "targets": labels}`."""

    def collate(rows: list[tuple[torch.Tensor, int]]) -> Any:
        length = max(int(ids.shape[0]) for ids, _ in rows)
        ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, (row, _) in enumerate(rows):
            ids[i, : row.shape[0]] = row
            mask[i, : row.shape[0]] = 1
        labels = torch.tensor([label for _, label in rows], dtype=torch.long)
        return {"inputs": {"input_ids": ids, "attention_mask": mask}, "targets": labels}

    return collate


def _text_classes(info: DatasetInfo, root: Path, options: Mapping[str, Any], columns: Mapping[str, Any],
                  train_rows: Any, val_rows: Any) -> tuple[Dataset[Any], Dataset[Any], DatasetInfo, Callable[..., Any]]:
    """Text and label columns: one row per document, padded with the tokenizer's pad token or,
    without one, a new id after its vocabulary (so padding is never a real token: a decoder's
    classifier reads the last token that is not padding)."""
    tokenizer = Tokenizer(options["tokenizer"], root)
    max_len = int(options.get("max_len", DEFAULT_MAX_LEN))
    train_y, val_y, classes = _label_ids(train_rows, val_rows, columns["label"])
    train, val = (LabelledText(tokenizer.encode([str(t) for t in rows[columns["text"]]]), y, max_len, split)
                  for rows, y, split in ((train_rows, train_y, "train"), (val_rows, val_y, "val")))
    pad = tokenizer.pad if tokenizer.pad is not None else tokenizer.vocab_size
    info = replace(info, num_classes=classes, vocab_size=max(tokenizer.vocab_size, pad + 1), max_seq_len=max_len,
                   pad_token_id=pad, train_size=len(train), val_size=len(val))
    return train, val, info, label_collate(pad)


class RowImages(Dataset[tuple[torch.Tensor, int]]):
    """(image, label) from an image column (PIL images, or {"bytes"/"path"} records). A path
    in the data is opened only inside `root` (the data_root): the data is the owner's, the
    path in it could name any file the worker can read."""

    def __init__(self, rows: Any, image: str, labels: list[int], transform: Any, root: Path) -> None:
        self.rows, self.image, self.labels, self.transform = rows, image, labels, transform
        self.targets = labels
        self.root = root

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import io

        from PIL import Image

        value = self.rows[index][self.image]
        if isinstance(value, Mapping):
            value = (Image.open(io.BytesIO(value["bytes"])) if value.get("bytes")
                     else Image.open(inside(self.root, str(value["path"]), "image path")))
        return self.transform(value), self.labels[index]


def undecoded(rows: Any, column: str) -> Any:
    """`rows` with an Image column left as {"bytes", "path"} records: `datasets` would
    otherwise open a record's path itself, wherever it points (RowImages checks it)."""
    import datasets

    if isinstance(rows.features.get(column), datasets.Image):
        return rows.cast_column(column, datasets.Image(decode=False))
    return rows


def _label_ids(train: Any, val: Any, column: str) -> tuple[list[int], list[int], int]:
    """Integer labels as they are; any other labels numbered in sorted order."""
    a, b = list(train[column]), list(val[column])
    if all(isinstance(v, int) and not isinstance(v, bool) for v in a + b):
        if min(a + b) < 0:
            raise ValueError(f"label column {column!r} has negative labels; use 0 to C-1 (or names)")
        return a, b, max(a + b) + 1
    classes = sorted({str(v) for v in a + b})
    index = {c: i for i, c in enumerate(classes)}
    return [index[str(v)] for v in a], [index[str(v)] for v in b], len(classes)


Collate = Callable[[list[Any]], Any]


def table(info: DatasetInfo, root: Path, seed: int, options: Mapping[str, Any],
          ) -> tuple[Dataset[Any], Dataset[Any], DatasetInfo, Collate | None, Collate | None]:
    """`files` or `hf_disk`: (train, val, info with sizes, collate, keyword collate: the
    causal-LM batches of a Hugging Face model, see `token_collate`)."""
    train_rows, val_rows = load_rows(info.name, root, options)
    columns = columns_of(options)
    require_columns(train_rows, columns, info.name)
    if val_rows is None:
        fraction = float(options.get("val_fraction", DEFAULT_VAL_FRACTION[info.name]))
        train_idx, val_idx = split_indices(len(train_rows), fraction, seed)
        train_rows, val_rows = train_rows.select(train_idx), train_rows.select(val_idx)
    else:
        require_columns(val_rows, columns, info.name)
    if "text" in columns and "label" in columns:
        train, val, info, collate = _text_classes(info, root, options, columns, train_rows, val_rows)
        return train, val, info, collate, None
    if "text" in columns:
        tokenizer = Tokenizer(options["tokenizer"], root)
        max_len = int(options.get("max_len", DEFAULT_MAX_LEN))
        packing = bool(options.get("packing", True))
        train, val = (TokenRows(tokenizer.encode([str(t) for t in rows[columns["text"]]]), max_len, packing,
                                tokenizer.eos) for rows in (train_rows, val_rows))
        if not len(train) or not len(val):
            raise ValueError(f"dataset {info.name!r}: a split has no text of 2 tokens or more")
        info = replace(info, num_classes=tokenizer.vocab_size, vocab_size=tokenizer.vocab_size,
                       max_seq_len=max_len, train_size=len(train), val_size=len(val))
        return train, val, info, token_collate(False), token_collate(True)
    train_y, val_y, classes = _label_ids(train_rows, val_rows, columns["label"])
    if "image" in columns:
        train_tf, val_tf = image_transforms(options)
        size = int(options.get("image_size", DEFAULT_IMAGE_SIZE))
        train_rows, val_rows = (undecoded(rows, columns["image"]) for rows in (train_rows, val_rows))
        train_ds: Dataset[Any] = RowImages(train_rows, columns["image"], train_y, train_tf, root)
        val_ds: Dataset[Any] = RowImages(val_rows, columns["image"], val_y, val_tf, root)
        info = replace(info, channels=3, image_size=size)
    else:
        feats = columns["features"]
        train_ds, val_ds = (
            torch.utils.data.TensorDataset(torch.tensor([[float(r[c]) for c in feats] for r in rows]),
                                           torch.tensor(y, dtype=torch.long))
            for rows, y in ((train_rows, train_y), (val_rows, val_y)))
        info = replace(info, features=len(feats))
    info = replace(info, num_classes=classes, train_size=len(train_y), val_size=len(val_y))
    return train_ds, val_ds, info, None, None

"""Your-own-data fixtures written by the tests (and bench/own_data.py): an image folder of three
easy classes, text as jsonl / parquet / csv, labelled text of three easy classes, a
tokenizer trained with `tokenizers`, and a tiny "pretrained" GPT-2 saved for `hf:<dir>`."""

from __future__ import annotations

import json
import random
from pathlib import Path

CLASSES = ("red", "green", "blue")
# Sentences of varying length, so padded micro-batches carry different token counts.
SENTENCES = [
    "the cat sat on the mat",
    "a dog ran after the ball in the park",
    "birds sing",
    "the quick brown fox jumps over the lazy dog again and again",
    "rain falls on the roof all night long",
    "we read a book",
    "the sun is warm today and the sky is blue",
    "fish swim in the cold river",
    "she plays the piano every morning before work",
    "it is late",
    "the train leaves at noon from the old station",
    "green leaves turn red in autumn",
    "he writes letters to his friends",
    "snow covers the quiet hills",
]


def make_image_folder(root: Path, per_class: int, size: int = 24, seed: int = 0, split: bool = False) -> Path:
    """`root/<class>/<i>.png` (or `root/train|val/<class>/`): each class a dominant colour
    with noise, so a small model tells them apart in a few steps."""
    from PIL import Image

    rng = random.Random(seed)
    parts = [("train", per_class), ("val", max(per_class // 3, 2))] if split else [("", per_class)]
    for part, count in parts:
        for c, name in enumerate(CLASSES):
            folder = root / part / name if part else root / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = []
                for _ in range(size * size):
                    rgb = [rng.randrange(0, 90) for _ in range(3)]
                    rgb[c] = rng.randrange(150, 256)
                    pixels.append(tuple(rgb))
                image = Image.new("RGB", (size, size))
                image.putdata(pixels)
                image.save(folder / f"{i}.png")
    return root


def text_rows(repeat: int = 1) -> list[dict[str, str]]:
    return [{"body": s, "id": str(i)} for i, s in enumerate(SENTENCES * repeat)]


def write_text(root: Path, kind: str, repeat: int = 1) -> str:
    """The sentences as `text.<kind>` (jsonl, parquet or csv) with columns body and id."""
    root.mkdir(parents=True, exist_ok=True)
    rows = text_rows(repeat)
    name = f"text.{kind}"
    if kind == "jsonl":
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), root / name)
    else:
        import csv

        with open(root / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["body", "id"])
            writer.writeheader()
            writer.writerows(rows)
    return name


# Sequence classification: each class's words start with its own letter, so a tiny model
# tells them apart from the bytes in a few steps; rows of 1 to 6 words pad differently.
CLASS_WORDS = {
    "apples": ("apple", "apricot", "avocado", "almond"),
    "berries": ("berry", "banana", "bramble", "bilberry"),
    "cherries": ("cherry", "coconut", "clementine", "cranberry"),
}


def write_labelled_text(root: Path, kind: str, rows: int, seed: int = 0) -> str:
    """`labelled.<kind>` (jsonl or parquet) with columns body (words of one class) and y (the
    class name); the classes take turns, the lengths are drawn from the seed."""
    rng = random.Random(seed)
    names = list(CLASS_WORDS)
    table = [{"body": " ".join(rng.choice(CLASS_WORDS[names[i % 3]]) for _ in range(rng.randint(1, 6))),
              "y": names[i % 3]} for i in range(rows)]
    root.mkdir(parents=True, exist_ok=True)
    name = f"labelled.{kind}"
    if kind == "jsonl":
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in table))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(table), root / name)
    return name


def train_tokenizer(directory: Path, vocab_size: int = 120) -> Path:
    """A byte-pair tokenizer trained on the sentences, saved as `directory/tokenizer.json`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "</s>"])
    tokenizer.train_from_iterator(SENTENCES, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def ensure_example_plugin() -> None:
    """Install examples/plugin into this environment unless it is, with its option
    declarations (0.2.0; `make install` does it)."""
    import subprocess
    import sys
    from importlib.metadata import entry_points

    if any(ep.name == "example_mlp" for ep in entry_points(group="accum.model_options")):
        return
    root = Path(__file__).resolve().parents[1] / "examples" / "plugin"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    str(root)], check=True, timeout=300)


def save_gpt2(folder: Path) -> Path:
    """A 2-layer GPT-2 causal LM over the bytes tokenizer's ids and its padding id 256, saved
    with save_pretrained: what `hf:<folder>` loads as a causal LM, or as a sequence classifier
    with a new head. No download."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=257, n_layer=2, n_embd=16, n_head=2, n_positions=64, pad_token_id=256)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder

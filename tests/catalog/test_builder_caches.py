"""What a warm worker's builders parse once and reuse (issue 45): the shipped digits, and a
data root's tokenizer.json while the file is unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.catalog.build import build_dataset
from services.catalog.builders.datasets import load_digits_arrays
from services.catalog.builders.own_data import Tokenizer


def test_the_digits_are_parsed_once_and_no_job_can_change_the_next_ones() -> None:
    images, labels = load_digits_arrays()
    assert load_digits_arrays()[0] is images
    with pytest.raises(ValueError, match="read-only"):
        images[0, 0] = 99.0
    first, second = build_dataset("digits"), build_dataset("digits")
    first.train.tensors[0].mul_(0)  # a job that wrote into its dataset's tensors
    assert second.train.tensors[0].abs().sum() > 0 and build_dataset("digits").train.tensors[0].abs().sum() > 0


def save_tokenizer(folder: Path, words: list[str]) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = HFTokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(words, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))


def test_a_tokenizer_file_is_parsed_once_while_it_is_unchanged(tmp_path: Path) -> None:
    save_tokenizer(tmp_path / "tok", ["apple", "pear"])
    first, again = Tokenizer("tok", tmp_path), Tokenizer("tok", tmp_path)
    assert again._tok is first._tok and first.vocab_size == 4
    save_tokenizer(tmp_path / "tok", ["apple", "pear", "plum", "fig"])  # replaced: read again
    file = tmp_path / "tok" / "tokenizer.json"
    os.utime(file, ns=(file.stat().st_atime_ns, file.stat().st_mtime_ns + 1_000_000))
    changed = Tokenizer("tok", tmp_path)
    assert changed._tok is not first._tok and changed.vocab_size == 6

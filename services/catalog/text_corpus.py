"""The shipped text corpus, split into character-level sequences (pure Python, torch-free).

The sequences are sentences, so their lengths vary: batches padded to their longest sequence
carry different numbers of real target tokens, which is what token-weighted accumulation must
get right. Every `VAL_EVERY`-th sentence goes to validation, so both splits span all chapters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

CORPUS_FILE = "alice.txt"
TEXT_DEFAULT_MAX_LEN = 128
VAL_EVERY = 10
PAD_ID = 0  # input id of padding; padded targets are ignore_index (-100) instead

_SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+")


@dataclass(frozen=True)
class CorpusStats:
    train_size: int
    val_size: int
    vocab_size: int


@lru_cache(maxsize=1)
def corpus_text() -> str:
    return resources.files("services.catalog").joinpath("data", CORPUS_FILE).read_text("utf-8")


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """Characters of the corpus in sorted order; token id = position + 1 (0 is padding)."""
    return tuple(sorted(set(" ".join(corpus_text().split()))))


def encode(text: str) -> list[int]:
    index = {ch: i + 1 for i, ch in enumerate(vocabulary())}
    try:
        return [index[ch] for ch in text]
    except KeyError as exc:
        raise ValueError(
            f"character {exc.args[0]!r} is not in the text corpus vocabulary"
        ) from None


@lru_cache(maxsize=8)
def sentences(max_len: int = TEXT_DEFAULT_MAX_LEN) -> tuple[str, ...]:
    """Sentences of the corpus with whitespace collapsed, cut into pieces of <= max_len + 1
    characters (a piece of n characters gives n - 1 (input, target) pairs)."""
    if max_len < 2:
        raise ValueError(f"text option max_len must be >= 2, got {max_len}")
    pieces: list[str] = []
    for paragraph in corpus_text().split("\n\n"):
        flat = " ".join(paragraph.split())
        for sentence in _SENTENCE_END.split(flat):
            for start in range(0, len(sentence), max_len + 1):
                piece = sentence[start : start + max_len + 1]
                if len(piece) >= 2:
                    pieces.append(piece)
    return tuple(pieces)


def split(max_len: int = TEXT_DEFAULT_MAX_LEN) -> tuple[list[str], list[str]]:
    """Fixed (train, val) split of `sentences(max_len)`."""
    all_pieces = sentences(max_len)
    train = [s for i, s in enumerate(all_pieces) if i % VAL_EVERY != VAL_EVERY - 1]
    val = [s for i, s in enumerate(all_pieces) if i % VAL_EVERY == VAL_EVERY - 1]
    return train, val


@lru_cache(maxsize=8)  # asked at every submit of a text job (epoch sizes, the memory floor)
def corpus_stats(max_len: int = TEXT_DEFAULT_MAX_LEN) -> CorpusStats:
    train, val = split(max_len)
    return CorpusStats(train_size=len(train), val_size=len(val), vocab_size=len(vocabulary()) + 1)

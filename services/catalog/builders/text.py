"""The `text` dataset as torch objects: character sequences and a padding collate function."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from services.catalog.text_corpus import PAD_ID, encode

IGNORE_INDEX = -100


class CharSequences(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Next-character prediction: item i is (ids[:-1], ids[1:]) of sentence i."""

    def __init__(self, pieces: Sequence[str]) -> None:
        self._ids = [torch.tensor(encode(piece), dtype=torch.long) for piece in pieces]

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self._ids[index]
        return ids[:-1], ids[1:]


def pad_collate(
    batch: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pads a batch to its longest sequence: inputs with PAD_ID, targets with -100 (ignored)."""
    length = max(int(inputs.shape[0]) for inputs, _ in batch)
    inputs = torch.full((len(batch), length), PAD_ID, dtype=torch.long)
    targets = torch.full((len(batch), length), IGNORE_INDEX, dtype=torch.long)
    for row, (x, y) in enumerate(batch):
        inputs[row, : x.shape[0]] = x
        targets[row, : y.shape[0]] = y
    return inputs, targets

"""`accum.datasets` entry point: called as `fn(data_root=, seed=, **options)`, returns a dict
with `train`, `val` (torch datasets of (input, label)), `num_classes`, and optionally `task`,
`channels`, `image_size`, `vocab_size`, `max_seq_len`, `collate_fn`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset


def example_blobs(data_root: Path | None = None, seed: int = 0, size: int = 256, classes: int = 3) -> dict[str, Any]:
    """Gaussian blobs on a 1x4x4 grid, one centre per class: easy to learn, no files."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, 16, generator=generator) * 3

    def draw(n: int) -> TensorDataset:
        labels = torch.randint(0, classes, (n,), generator=generator)
        points = centres[labels] + torch.randn(n, 16, generator=generator)
        return TensorDataset(points.view(n, 1, 4, 4), labels)

    return {"train": draw(size), "val": draw(max(size // 4, 1)), "num_classes": classes,
            "channels": 1, "image_size": 4}

"""The example plugin on its own: the functions behind its entry points build and learn."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from accum_plugin_example.datasets import example_blobs
from accum_plugin_example.models import example_mlp


def test_model_and_dataset_fit_together() -> None:
    torch.manual_seed(0)
    data = example_blobs(seed=1, size=120)
    model = example_mlp(SimpleNamespace(input_shape=(1, 4, 4), num_classes=data["num_classes"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    x, y = data["train"].tensors
    for _ in range(50):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    vx, vy = data["val"].tensors
    assert (model(vx).argmax(1) == vy).float().mean() > 0.8

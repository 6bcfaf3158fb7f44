"""The demo's pair learns: small_cnn on digits passes 90% validation accuracy in a few epochs.

A plain training loop with batches of 64 (the demo's m=16 x N=4: exact accumulation gives
the same updates), AdamW, fixed seeds. The service demo depends on this.
"""

from __future__ import annotations

import pytest
import torch

from accumcore.data import make_loader
from services.catalog.build import build_dataset, build_loss, build_model

EFFECTIVE_BATCH = 16 * 4
EPOCHS = 3


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def val_accuracy(model: torch.nn.Module, dataset: torch.utils.data.TensorDataset) -> float:
    inputs, targets = dataset.tensors
    model.eval()
    with torch.no_grad():
        return (model(inputs).argmax(dim=1) == targets).float().mean().item()


def test_small_cnn_reaches_90_percent_on_digits() -> None:
    torch.manual_seed(0)
    bundle = build_dataset("digits")
    model = build_model("small_cnn", bundle)
    loss_fn = build_loss(bundle)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = val_accuracy(model, bundle.val)
    for epoch in range(EPOCHS):
        model.train()
        for inputs, targets in make_loader(bundle.train, batch_size=EFFECTIVE_BATCH, seed=epoch):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(inputs), targets).backward()
            optimizer.step()
    after = val_accuracy(model, bundle.val)
    assert before < 0.3  # chance level before training: the gain is the model's
    assert after > 0.90, after

"""Whether the model's own loss scores its labels shifted is told from what it computes.

Float64 oracles: a tiny XLNet LM head (its loss scores labels in place although its class name
ends in ``LMHeadModel``) and a causal LM under a name that says nothing, each trained with
padded micro-batches and compared with the big batch of each window; a model whose loss is
neither refused, the ``shift_labels=`` override kept.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from accumcore import Callback, Trainer
from bench.trainer.exactness_detection import VOCAB
from bench.trainer.exactness_detection import lm_batches as padded_batches


def tiny_xlnet() -> nn.Module:
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=VOCAB, d_model=8, n_layer=1, n_head=2, d_inner=16, dropout=0.0,
                         pad_token_id=0)
    return XLNetLMHeadModel(config).double()


@dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class TinyDecoder(nn.Module):
    """A causal LM (labels shifted inside) whose name says nothing about shifting; with
    ``smoothing`` its loss is label-smoothed: neither plain cross-entropy."""

    def __init__(self, smoothing: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Embedding(VOCAB, 6, dtype=torch.float64)
        self.head = nn.Linear(6, VOCAB, dtype=torch.float64)
        self.smoothing = smoothing

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> Output:
        logits = self.head(torch.tanh(self.embed(input_ids)))
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                               ignore_index=-100, label_smoothing=self.smoothing)
        return Output(logits, loss)


def big_batch_training(model: nn.Module, batches: list[dict], n: int, lr: float) -> nn.Module:
    """The oracle: each window's micro-batches as one batch, the model's own loss, one SGD step."""
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    for start in range(0, len(batches), n):
        window = batches[start:start + n]
        big = {key: torch.cat([b[key] for b in window]) for key in window[0]}
        reference(**big).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return reference


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


class Events(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def on_event(self, trainer, kind, message, data) -> None:
        self.events.append((kind, data))


@pytest.mark.parametrize(("build", "shifted"), [(tiny_xlnet, False), (TinyDecoder, True)])
def test_the_model_s_own_loss_decides_the_shift_not_its_name(build, shifted: bool) -> None:
    model = build()
    batches = padded_batches()
    reference = big_batch_training(model, batches, 2, lr=0.5)
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), accumulation_steps=2, callbacks=[events])
    history = trainer.fit(batches, epochs=1)
    assert len(history.steps) == 3 and trainer.shift_labels is shifted
    assert max_diff(model, reference) <= 1e-12
    assert ("shift_labels_detected", {"shift_labels": shifted}) in events.events


def test_the_in_place_lm_head_counted_shifted_is_not_the_big_batch() -> None:
    """What the name-based guess did to XLNet: the oracle tells it apart (so the test above can fail)."""
    model = tiny_xlnet()
    batches = padded_batches()
    reference = big_batch_training(model, batches, 2, lr=0.5)
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), accumulation_steps=2, shift_labels=True).fit(batches)
    assert max_diff(model, reference) > 1e-6


def test_a_loss_that_is_neither_shifted_nor_in_place_cross_entropy_is_refused() -> None:
    model = TinyDecoder(smoothing=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), accumulation_steps=2)
    with pytest.raises(ValueError, match=r"matches neither.*shift_labels=True.*shift_labels=False"):
        trainer.fit(padded_batches())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    # The override: the user says what the loss scores, and nothing is detected.
    model = TinyDecoder(smoothing=0.1)
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), accumulation_steps=2,
                      shift_labels=True, callbacks=[events])
    trainer.fit(padded_batches())
    assert trainer.global_step == 3 and not any(kind == "shift_labels_detected" for kind, _ in events.events)


def test_detection_changes_nothing_training_computes() -> None:
    """Detected or given, the same run: bitwise (CPU), and no RNG draw moved."""
    runs = []
    for shift in (None, True):
        model = TinyDecoder()
        torch.manual_seed(5)
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), accumulation_steps=2,
                shift_labels=shift).fit(padded_batches())
        runs.append(([p.detach().clone() for p in model.parameters()], torch.rand(3)))
    (params_a, draw_a), (params_b, draw_b) = runs
    assert all(torch.equal(p, q) for p, q in zip(params_a, params_b, strict=True))
    assert torch.equal(draw_a, draw_b)

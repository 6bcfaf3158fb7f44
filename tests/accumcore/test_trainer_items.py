"""Item counts that match what the loss averages over, and Hugging Face style batches.

The trainer weights micro-batch i by n_i / W, so n_i must count what the loss averages over:
- float targets [B, T] whose T varies between micro-batches: an element-wise loss (MSE)
  averages over B x T elements, not B rows; inferred for the element-wise losses torch ships;
- soft token targets [B, T, V]: ``count_items="tokens"`` counts the B x T positions; with a
  loss the trainer does not know and a varying T, the count is ambiguous and refused;
- labels a causal LM shifts before its loss: ``shift_labels=True`` (told from the model's
  own loss, ``accumcore.label_shift``) counts the non-ignored labels[..., 1:];
- dict batches are passed as keyword arguments, and ``loss_fn=None`` uses the model's own
  loss when its output carries one (the count then comes from the batch's ``labels``);
- a loss callable without a ``reduction`` attribute is checked once, on the first
  micro-batch, against its values on the two halves: a sum is refused, so is a mean over
  something other than the counted items.
Every case is compared in float64 with a big-batch step per window.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from accumcore import Trainer

VOCAB = 7


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)


def _big_batch(model: nn.Module, windows: list[list], loss_sum: Callable[[nn.Module, object], tuple[torch.Tensor, float]]):
    """One step per window on (sum of item losses over the window) / (items of the window)."""
    model = copy.deepcopy(model)
    optimizer = _sgd(model)
    for window in windows:
        total, count = torch.zeros((), dtype=torch.float64), 0.0
        for batch in window:
            s, n = loss_sum(model, batch)
            total, count = total + s, count + n
        (total / count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def _windows(batches: list, n: int) -> list[list]:
    return [batches[i : i + n] for i in range(0, len(batches), n)]


# ------------------------------------------------------------- float [B, T] targets
class PerStep(nn.Module):
    """(B, T, 3) inputs -> (B, T) outputs: a regression per time step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(3, 1).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(x)).squeeze(-1)


def _sequences(lengths: list[int], rows: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(4)
    return [(torch.randn(rows, t, 3, generator=g, dtype=torch.float64), torch.randn(rows, t, generator=g, dtype=torch.float64))
            for t in lengths]


def test_float_sequence_targets_with_varying_length_count_elements() -> None:
    batches = _sequences([2, 7, 3, 1, 5, 4])
    model = PerStep()
    reference = _big_batch(model, _windows(batches, 3),
                           lambda m, b: (F.mse_loss(m(b[0]), b[1], reduction="sum"), b[1].numel()))
    trainer = Trainer(model, _sgd(model), loss_fn=nn.MSELoss(), accumulation_steps=3)
    history = trainer.fit(batches, epochs=1)
    assert _max_diff(model, reference) <= 1e-12
    assert [round(s["items_per_s"] * s["step_time_s"]) for s in history.steps] == [24, 20]


# ------------------------------------------------------------ soft token targets
def soft_token_ce(logits: torch.Tensor, probabilities: torch.Tensor) -> torch.Tensor:
    """Mean over the B x T positions of the cross-entropy with a soft target distribution."""
    return -(probabilities * logits.log_softmax(-1)).sum(-1).mean()


class TokenLogits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 5).double()
        self.head = nn.Linear(5, VOCAB).double()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def _soft_batches(lengths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(6)
    return [(torch.randint(0, VOCAB, (2, t), generator=g),
             torch.rand(2, t, VOCAB, generator=g, dtype=torch.float64).softmax(-1)) for t in lengths]


def test_soft_token_targets_count_positions_with_count_items_tokens() -> None:
    batches = _soft_batches([3, 6, 2, 5])
    model = TokenLogits()
    reference = _big_batch(model, _windows(batches, 2),
                           lambda m, b: (soft_token_ce(m(b[0]), b[1]) * b[1].shape[0] * b[1].shape[1],
                                         b[1].shape[0] * b[1].shape[1]))
    trainer = Trainer(model, _sgd(model), loss_fn=soft_token_ce, accumulation_steps=2, count_items="tokens")
    trainer.fit(batches, epochs=1)
    assert _max_diff(model, reference) <= 1e-12


def test_an_ambiguous_count_is_refused_rather_than_guessed() -> None:
    model = TokenLogits()
    trainer = Trainer(model, _sgd(model), loss_fn=soft_token_ce, accumulation_steps=2)
    with pytest.raises(ValueError, match=r"count_items='tokens'.*count_items='rows'"):
        trainer.fit(_soft_batches([3, 6, 2, 5]), epochs=1)


def test_rows_and_callable_counts() -> None:
    batches = _sequences([2, 7, 3, 1])
    model = PerStep()

    def row_mean_mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((out - y) ** 2).mean(dim=1).mean()  # a mean of per-row means

    reference = _big_batch(model, _windows(batches, 2),
                           lambda m, b: (((m(b[0]) - b[1]) ** 2).mean(dim=1).sum(), b[1].shape[0]))
    trainer = Trainer(model, _sgd(model), loss_fn=row_mean_mse, accumulation_steps=2, count_items="rows")
    trainer.fit(batches, epochs=1)
    assert _max_diff(model, reference) <= 1e-12
    other = PerStep()
    Trainer(other, _sgd(other), loss_fn=row_mean_mse, accumulation_steps=2,
            count_items=lambda x, y: y.shape[0]).fit(batches, epochs=1)
    assert _max_diff(other, reference) <= 1e-12


def test_an_unknown_count_mode_is_refused() -> None:
    model = PerStep()
    with pytest.raises(ValueError, match=r"count_items must be 'tokens', 'rows', a callable or None"):
        Trainer(model, _sgd(model), loss_fn=nn.MSELoss(), count_items="samples")  # type: ignore[arg-type]


# ------------------------------------------------------- causal LM, dict batches
@dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class TinyForCausalLM(TokenLogits):
    """Hugging Face's shape: keyword inputs, labels shifted inside, an output with .loss."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,  # type: ignore[override]
                labels: torch.Tensor | None = None) -> Output:
        logits = self.head(torch.tanh(self.embed(input_ids)))
        if attention_mask is not None:
            logits = logits * attention_mask[..., None]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
        return Output(logits, loss)


class TinyLM(TinyForCausalLM):
    """The same model under a name that says nothing about shifting."""


def _lm_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(8)
    batches = []
    for valid in ([6, 2], [3, 6], [1, 4], [5, 5], [2, 3]):
        ids = torch.randint(0, VOCAB, (2, 6), generator=g)
        labels = ids.clone()
        mask = torch.ones(2, 6)
        for row, n in enumerate(valid):
            labels[row, n:] = -100
            mask[row, n:] = 0
        batches.append({"input_ids": ids, "attention_mask": mask.double(), "labels": labels})
    return batches


def _shifted_loss_sum(model: nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
    logits = model(batch["input_ids"], batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    total = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum")
    return total, int((labels != -100).sum())


def test_a_causal_lm_returning_its_loss_counts_shifted_labels() -> None:
    batches = _lm_batches()
    model = TinyForCausalLM()
    reference = _big_batch(model, _windows(batches, 2), _shifted_loss_sum)
    trainer = Trainer(model, _sgd(model), loss_fn=None, accumulation_steps=2)
    history = trainer.fit(batches, epochs=1)
    assert _max_diff(model, reference) <= 1e-12
    assert [round(s["items_per_s"] * s["step_time_s"]) for s in history.steps] == [13, 11, 3]  # valid-1 per row: (5+1)+(2+5), (0+3)+(4+4), 1+2


def test_shift_labels_for_a_user_loss_that_shifts() -> None:
    batches = [(b["input_ids"], b["labels"]) for b in _lm_batches()]
    model = TokenLogits()

    def shifted_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)

    shifted_ce.reduction = "mean"  # type: ignore[attr-defined]  # declared: no scale check
    reference = _big_batch(model, _windows(batches, 2), lambda m, b: (
        F.cross_entropy(m(b[0])[:, :-1].reshape(-1, VOCAB), b[1][:, 1:].reshape(-1), ignore_index=-100,
                        reduction="sum"), int((b[1][:, 1:] != -100).sum())))
    trainer = Trainer(model, _sgd(model), loss_fn=shifted_ce, accumulation_steps=2, shift_labels=True)
    trainer.fit(batches, epochs=1)
    assert _max_diff(model, reference) <= 1e-12


def test_a_causal_lm_under_any_name_is_told_shifted_by_its_loss() -> None:
    model = TinyLM()
    trainer = Trainer(model, _sgd(model), loss_fn=None, accumulation_steps=2)
    trainer.fit(_lm_batches(), epochs=1)
    assert trainer.shift_labels is True
    assert _max_diff(model, _big_batch(TinyLM(), _windows(_lm_batches(), 2), _shifted_loss_sum)) <= 1e-12


def test_dict_batches_with_a_loss_fn_get_keyword_inputs_and_labels_as_targets() -> None:
    batches = _lm_batches()
    model = TinyForCausalLM()

    def logits_ce(output: Output, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)

    logits_ce.reduction = "mean"  # type: ignore[attr-defined]
    reference = _big_batch(model, _windows(batches, 2), _shifted_loss_sum)
    history = Trainer(model, _sgd(model), loss_fn=logits_ce, accumulation_steps=2, shift_labels=True).fit(
        batches, epochs=1, val_loader=batches)
    assert _max_diff(model, reference) <= 1e-12
    with torch.no_grad():
        sums = [_shifted_loss_sum(model, b) for b in batches]
    assert abs(history.evals[0]["val_loss"] - float(sum(s for s, _ in sums)) / sum(n for _, n in sums)) <= 1e-12


# ---------------------------------------------------- losses without a reduction
def _class_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))
            for n in (3, 3, 3, 1)]


def _class_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def test_a_loss_callable_returning_a_sum_is_refused() -> None:
    model = _class_model()
    trainer = Trainer(model, _sgd(model), loss_fn=lambda out, y: F.cross_entropy(out, y, reduction="sum"),
                      accumulation_steps=2)
    with pytest.raises(ValueError, match="returns a sum over the micro-batch"):
        trainer.fit(_class_batches(), epochs=1)
    assert all(p.grad is None for p in model.parameters())  # refused before any backward


def test_a_loss_callable_averaging_over_other_items_is_refused() -> None:
    batches = [(b["input_ids"], b["labels"]) for b in _lm_batches()]
    model = TokenLogits()

    def row_mean(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:  # per-row means, then rows
        per_token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        return (per_token.sum(1) / (labels != -100).sum(1)).mean()

    with pytest.raises(ValueError, match="neither the mean over the items the trainer counts"):
        Trainer(model, _sgd(model), loss_fn=row_mean, accumulation_steps=2).fit(batches, epochs=1)


def test_a_mean_loss_callable_passes_the_check_and_is_exact() -> None:
    batches = _class_batches()
    model = _class_model()
    reference = _big_batch(model, _windows(batches, 2),
                           lambda m, b: (F.cross_entropy(m(b[0]), b[1], reduction="sum"), len(b[1])))
    Trainer(model, _sgd(model), loss_fn=lambda out, y: F.cross_entropy(out, y), accumulation_steps=2).fit(batches, epochs=1)
    assert _max_diff(model, reference) <= 1e-12

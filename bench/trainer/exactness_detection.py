"""Rows of bench/trainer/exactness.py for issue 28: an LM head that scores its labels in place,
a one-micro-batch first window, and what the exactness check catches.

- ``unshifted_lm_head``: a tiny XLNet LM head (``XLNetLMHeadModel``: its own loss scores the
  labels in place although its name ends in ``LMHeadModel``), float64, padded micro-batches of
  2 rows, N = 2, 3 steps, the model's own loss. Max abs difference of the final weights vs a
  float64 big-batch step per window: accum (shift told from the loss), accum with the old
  name-based guess (``shift_labels=True``), the tutorial loop (loss / N).
- ``one_micro_batch_first_window``: the epoch schedule ``{0: 1, 1: 2}``, 2 epochs of micro-batches
  of 6, 6, 6, 5 rows, float64: the same difference for accum, and the check's status on its
  first window (before the fix: ``passed`` with relative error 0.0 on a window of one part).
- ``detection``: each usual mistake -> the window at which ``verify_window=True`` catches it
  (1 = before the first step), the cause and the fix it names, or ``pending`` and why. Every
  named fix is one the check re-ran and saw pass.
Lightning, Accelerate and the HF Trainer are not run for these rows (see ``peers``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from accumcore import Callback, ExactnessError, Trainer

VOCAB = 11
LR = 0.5


class _Checks(Callback):
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        if kind == "exactness_check":
            self.checks.append({**data, "message": message})


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def lm_batches() -> list[dict[str, torch.Tensor]]:
    """Six micro-batches of two rows padded to 6 tokens; valid lengths vary, so a shifted and an
    in-place count weigh the micro-batches differently (tests/accumcore use them too)."""
    g = torch.Generator().manual_seed(8)
    batches = []
    for valid in ([6, 2], [3, 6], [2, 5], [5, 5], [2, 3], [6, 4]):
        ids = torch.randint(1, VOCAB, (2, 6), generator=g)
        labels, mask = ids.clone(), torch.ones(2, 6, dtype=torch.float64)
        for row, n in enumerate(valid):
            ids[row, n:], labels[row, n:], mask[row, n:] = 0, -100, 0
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def _xlnet() -> nn.Module:
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=VOCAB, d_model=8, n_layer=1, n_head=2, d_inner=16, dropout=0.0, pad_token_id=0)
    return XLNetLMHeadModel(config).double()


def unshifted_lm_head() -> dict[str, Any]:
    batches = lm_batches()
    model = _xlnet()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    for start in range(0, len(batches), 2):
        big = {key: torch.cat([b[key] for b in batches[start:start + 2]]) for key in batches[0]}
        reference(**big).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    row: dict[str, Any] = {}
    for name, options in (("accum", {}), ("accum_name_guess", {"shift_labels": True})):
        trained = copy.deepcopy(model)
        trainer = Trainer(trained, torch.optim.SGD(trained.parameters(), lr=LR), accumulation_steps=2, **options)
        trainer.fit(batches)
        row[name] = {"max_abs_diff": _max_diff(trained, reference), "shift_labels": trainer.shift_labels}
    trained = copy.deepcopy(model)
    optimizer = torch.optim.SGD(trained.parameters(), lr=LR)
    for index, batch in enumerate(batches):
        (trained(**batch).loss / 2).backward()
        if index % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()
    row["tutorial_loop"] = {"max_abs_diff": _max_diff(trained, reference)}
    return row


def _class_batches(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(6)
    return [(torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))
            for n in sizes]


def _class_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def one_micro_batch_first_window() -> dict[str, Any]:
    batches = _class_batches([6, 6, 6, 6])
    windows = [[b] for b in batches] + [batches[0:2], batches[2:4]]  # epoch 0: N = 1, epoch 1: N = 2
    model = _class_model()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    for window in windows:
        F.cross_entropy(reference(torch.cat([x for x, _ in window])), torch.cat([y for _, y in window])).backward()
        optimizer.step()
        optimizer.zero_grad()
    trained = copy.deepcopy(model)
    checks = _Checks()
    Trainer(trained, torch.optim.SGD(trained.parameters(), lr=LR), loss_fn=nn.CrossEntropyLoss(),
            accumulation_steps={0: 1, 1: 2}, verify_window=True, callbacks=[checks]).fit(batches, epochs=2)
    first = checks.checks[0]
    return {"accum": {"max_abs_diff": _max_diff(trained, reference), "check_status": first["status"],
                      "check_parts": first["item_counts"], "check_rel_error": first["rel_error"]}}


# ------------------------------------------------------------------ detection table
class _SumLoss(nn.Module):
    reduction = "mean"  # declares a mean: nothing refuses it up front

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                               reduction="sum")


class _TokenMean(nn.Module):
    reduction = "mean"

    def __init__(self, shift: bool = False) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.shift:
            logits, targets = logits[:, :-1], targets[:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


class RowMean(nn.Module):
    """The mean over rows of each row's mean token cross-entropy: declares 'mean', is not the
    token mean the trainer counts by default (tests/accumcore use it too)."""

    reduction = "mean"

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        per_token = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="none")
        valid = (targets != -100).to(per_token.dtype)
        return ((per_token * valid).sum(1) / valid.sum(1).clamp(min=1)).mean()


class _TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 6, dtype=torch.float64)
        self.head = nn.Linear(6, VOCAB, dtype=torch.float64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def _token_batches(full_first: int, padded: int, seed: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``full_first`` batches of rows without padding, then ``padded`` with 1..6 valid tokens."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for index in range(full_first + padded):
        tokens = torch.randint(0, VOCAB, (4, 6), generator=g)
        targets = torch.randint(0, VOCAB, (4, 6), generator=g)
        if index >= full_first:
            valid = torch.randint(1, 7, (4,), generator=g)
            targets[torch.arange(6)[None, :] >= valid[:, None]] = -100
        batches.append((tokens, targets))
    return batches


Mistake = tuple[Callable[[], nn.Module], dict[str, Any], Any, dict[str, Any]]


def _mistakes() -> dict[str, Mistake]:
    """name -> (model, trainer options, batches, fit options). The last is no mistake on its
    data (a row mean is the token mean where every row is full): it must stay pending."""
    padded = _token_batches(0, 6)
    first_full = _token_batches(3, 6)
    return {
        "summing_loss": (_TokenModel, {"loss_fn": _SumLoss()}, padded, {}),
        "summing_loss_one_micro_batch_window": (
            _class_model, {"loss_fn": _ClassSum(), "accumulation_steps": {0: 1, 1: 2}}, _class_batches([6, 6, 6, 6]),
            {"epochs": 2}),
        "row_mean_counted_as_tokens": (_TokenModel, {"loss_fn": RowMean()}, padded, {}),
        "row_mean_counted_as_tokens_first_window_full_rows": (_TokenModel, {"loss_fn": RowMean()}, first_full, {}),
        "row_mean_counted_as_tokens_with_shift_labels": (
            _TokenModel, {"loss_fn": RowMean(), "shift_labels": True}, padded, {}),
        "token_mean_counted_as_rows": (_TokenModel, {"loss_fn": _TokenMean(), "count_items": "rows"}, padded, {}),
        "shifted_loss_counted_in_place": (_TokenModel, {"loss_fn": _TokenMean(shift=True)}, padded, {}),
        "in_place_loss_counted_shifted": (_TokenModel, {"loss_fn": _TokenMean(), "shift_labels": True}, padded, {}),
        "row_mean_on_full_rows_only": (_TokenModel, {"loss_fn": RowMean()}, _token_batches(6, 0), {}),
    }


class _ClassSum(nn.Module):
    reduction = "mean"

    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target, reduction="sum")


def detection() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for name, (build, options, batches, fit) in _mistakes().items():
        model = build()
        checks = _Checks()
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=LR), verify_window=True,
                          callbacks=[checks], **{"accumulation_steps": 3, **options})
        row: dict[str, Any] = {}
        try:
            trainer.fit(batches, epochs=fit.get("epochs", 1))
            row["caught"] = False
        except ExactnessError as error:
            row.update(caught=True, cause=error.cause, at_window=trainer.global_step + 1)
        last = checks.checks[-1] if checks.checks else {}
        row["status"] = last.get("status")
        row["fix"] = last.get("fix")
        row["pending"] = last.get("pending")
        row["checks"] = [c.get("status") for c in checks.checks]
        table[name] = row
    return table


def rows() -> dict[str, Any]:
    """What bench/trainer/exactness.py adds to its record."""
    return {"unshifted_lm_head": unshifted_lm_head(), "one_micro_batch_first_window": one_micro_batch_first_window(),
            "detection": detection()}

"""Mapping batches padded per micro-batch, joined as one batch for the exactness check.

A Hugging Face style loader pads each micro-batch to its own longest row, so a window's
micro-batches cannot be concatenated as they are. Their big batch is what one collate would
have made of all their rows: every row padded to the window's longest, on the right, with
``input_ids`` the model's pad id, ``attention_mask`` 0 and ``labels`` the ignore index. Padding
on the right under an attention mask changes no real token's output (a causal model does not
look ahead, and masked positions are not attended to), so the big batch's loss and gradient
are those of the unpadded rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.nn import functional as F

# Keys padded along the sequence dimension, and their padding; another key that differs in
# length between micro-batches cannot be padded without knowing what it means.
PADDED_KEYS = ("input_ids", "attention_mask", "labels", "token_type_ids")


def pad_id_of(module: torch.nn.Module) -> int:
    """The model's ``config.pad_token_id``, else 0 (masked out either way)."""
    pad = getattr(getattr(module, "config", None), "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else 0


def pad_concat(batches: list[Mapping[str, Any]], pad_id: int, ignore_index: int) -> dict[str, Any]:
    """The mappings' rows as one mapping, sequence keys right-padded to the longest row
    (ValueError naming the key that cannot be padded)."""
    first = batches[0]
    if any(b.keys() != first.keys() for b in batches):
        raise ValueError("the micro-batches' mappings have different keys")
    if "input_ids" in first and "attention_mask" not in first:
        raise ValueError("input_ids of different lengths and no attention_mask: padding would change "
                         "what the model computes")
    fill = {"input_ids": pad_id, "attention_mask": 0, "labels": ignore_index, "token_type_ids": 0}
    joined: dict[str, Any] = {}
    for key in first:
        values = [b[key] for b in batches]
        if not all(isinstance(v, torch.Tensor) and v.dim() >= 1 for v in values):
            raise ValueError(f"{key!r} is not a tensor with a batch dimension in every micro-batch")
        if len({tuple(v.shape[1:]) for v in values}) == 1:
            joined[key] = torch.cat(values)
            continue
        if key not in fill or any(v.dim() != 2 for v in values):
            raise ValueError(f"{key!r} differs in length between micro-batches and is not one of "
                             f"{', '.join(PADDED_KEYS)}: pad it in the collate function, or give the "
                             "DataLoader a targets_for(indices) hook")
        longest = max(v.shape[1] for v in values)
        joined[key] = torch.cat([F.pad(v, (0, longest - v.shape[1]), value=fill[key]) for v in values])
    return joined

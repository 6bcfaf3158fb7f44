"""Model constructors behind the catalog's names: built-ins and adapted torchvision models.

Torchvision models keep their architecture exactly; an `InputAdapter` in front of them makes
any catalog image fit:
- grayscale inputs are repeated to 3 channels (equivalent to a 1-channel first convolution
  whose kernel is the sum of the 3-channel one, and the same code for all 80 models, whose
  first layers live under different attribute paths);
- images smaller than the model's `min_input_size` (or not a multiple of its patch/partition
  grid) are resized bilinearly on the device; larger ones pass unchanged.
Models are always randomly initialised: weights are never downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from services.catalog.entries import DatasetInfo, ModelInfo
from services.catalog.families.torchvision import torchvision_input_side


class InputAdapter(nn.Module):
    """Repeats 1-channel images to 3 channels and resizes them to `side` x `side` if needed."""

    def __init__(self, side: int) -> None:
        super().__init__()
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] not in (1, 3):
            raise ValueError(
                f"expected images of shape (batch, 1 or 3, H, W), got {tuple(x.shape)}"
            )
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-2:] != (self.side, self.side):
            x = F.interpolate(x, size=(self.side, self.side), mode="bilinear", align_corners=False)
        return x

    def extra_repr(self) -> str:
        return f"side={self.side}"


class AdaptedImageModel(nn.Module):
    """A torchvision classifier (`net`) behind an `InputAdapter` (`adapter`)."""

    def __init__(self, net: nn.Module, side: int) -> None:
        super().__init__()
        self.adapter = InputAdapter(side)
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(self.adapter(x))
        return out if isinstance(out, torch.Tensor) else out.logits


def build_torchvision(info: ModelInfo, dataset: DatasetInfo, options: Mapping[str, Any]) -> AdaptedImageModel:
    """The torchvision model sized for the dataset's classes behind its input adapter (no
    options: the torchvision family declares none)."""
    assert dataset.image_size is not None and dataset.num_classes is not None
    side = torchvision_input_side(info, dataset.image_size)
    kwargs: dict[str, Any] = {"num_classes": dataset.num_classes}
    if info.name in ("googlenet", "inception_v3"):
        # Auxiliary heads change the output type in train mode and need their own loss terms.
        kwargs.update(aux_logits=False, init_weights=True)
    if info.name.startswith("vit_"):
        kwargs["image_size"] = side  # position embeddings are sized for one image size
    if info.name.startswith("maxvit"):
        kwargs["input_size"] = (side, side)
    net = torchvision.models.get_model(info.name, weights=None, **kwargs)
    return AdaptedImageModel(net, side)


def build_builtin(info: ModelInfo, dataset: DatasetInfo, options: Mapping[str, Any]) -> nn.Module:
    """`mlp`, `small_cnn` or `tiny_transformer` sized for the dataset, with its options."""
    if info.name == "tiny_transformer":
        assert dataset.vocab_size is not None and dataset.max_seq_len is not None
        return TinyTransformer(dataset.vocab_size, dataset.max_seq_len, **options)
    assert dataset.num_classes is not None
    if info.name == "mlp":
        return MLP(math.prod(dataset.input_shape), dataset.num_classes, **options)
    assert info.name == "small_cnn" and dataset.channels is not None, info.name  # families/builtin_models.py
    return SmallCNN(dataset.channels, dataset.num_classes, **options)


class MLP(nn.Module):
    """Flatten, `depth` hidden layers of `hidden` units with ReLU, linear head."""

    def __init__(
        self, in_features: int, num_classes: int, hidden: int = 128, depth: int = 1
    ) -> None:
        super().__init__()
        if hidden < 1 or depth < 0:
            raise ValueError(
                f"mlp needs hidden >= 1 and depth >= 0, got hidden={hidden}, depth={depth}"
            )
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class SmallCNN(nn.Module):
    """Three 3x3 convolutions, one 2x2 max-pool, a 2x2 adaptive average pool, linear head.

    No BatchNorm and no dropout, so accumulation with it is exactly the big batch
    (docs/accumulation.md rule 8). Works from 8x8 (digits) upward.
    """

    def __init__(self, in_channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"small_cnn needs width >= 1, got {width}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(2 * width * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class TinyTransformer(nn.Module):
    """Causal character language model: token + learned position embeddings, pre-norm
    Transformer blocks with a causal mask, linear head. Input (B, T) ids -> (B, T, vocab).

    Padding sits at the end of each sequence, so with the causal mask no real token attends
    to padding; padded positions only need their targets ignored (-100), which the loss does.
    Dropout is 0 so accumulated and big-batch updates are comparable exactly.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"tiny_transformer needs d_model divisible by n_heads, got {d_model} and {n_heads}"
            )
        self.max_len = max_len
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model,
            n_heads,
            dim_feedforward=4 * d_model,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds the model's max_len {self.max_len}")
        positions = torch.arange(length, device=ids.device)
        h = self.tokens(ids) + self.positions(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(
            length, device=ids.device, dtype=h.dtype
        )
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))

"""`accum.models` entry point: called as `fn(dataset, **options)`, returns a torch module.

`dataset` is the built dataset's description (`num_classes`, `input_shape`, `task`, ...);
the options are the job spec's model keys besides `name`.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn


def example_mlp(dataset: Any, hidden: int = 32) -> nn.Module:
    """A two-layer perceptron sized for the dataset's inputs and classes."""
    if not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"example_mlp option hidden must be an integer >= 1; got {hidden!r}")
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(dataset.input_shape), hidden),
        nn.ReLU(),
        nn.Linear(hidden, dataset.num_classes),
    )

"""Fixtures of the catalog's torch tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_intra_op_thread() -> Iterator[None]:
    """The test machine's two cores are shared: with more intra-op threads torch mostly spins
    (measured: efficientnet_b0's step took 7 s of CPU with 2 threads under load, 0.13 s with 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

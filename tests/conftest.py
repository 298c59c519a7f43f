"""Shared pytest set-up."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """The tests use small tensors on 2 shared cores, where torch's intra-op threads only spin
    against each other (elementwise ops ~30x slower under load): run them on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

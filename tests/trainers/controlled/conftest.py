"""One torch thread for the controlled study's small ops (as its runner uses): on a shared 2-core CPU two threads
stall at every OpenMP barrier."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

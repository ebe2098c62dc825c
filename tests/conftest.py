import os
import sys

import pytest
import torch

# The shared kernel test case lives beside the tests.
sys.path.insert(0, os.path.dirname(__file__))

# Test problems are small: one thread is faster for them, and immune to the
# OpenMP oversubscription that makes two threads crawl on a busy 2-core machine.
torch.set_num_threads(1)


@pytest.fixture
def single_thread():
    """One torch thread for the duration of a test, whatever an earlier test left (BLAS round-off
    depends on the thread count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

import os
import sys

import torch

# The shared kernel test case lives beside the tests.
sys.path.insert(0, os.path.dirname(__file__))

# Test problems are small: one thread is faster for them, and immune to the
# OpenMP oversubscription that makes two threads crawl on a busy 2-core machine.
torch.set_num_threads(1)

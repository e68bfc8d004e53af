"""The MLP user model the CLI tests name, and a plan of it (the ``mlp_files`` fixture is in tests/conftest.py)."""

from __future__ import annotations

MLP = "tests.cli.user_models:mlp"  # Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10)
MIXED = {"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 2, "stages": [
    {"layers": [0, 2], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
    {"layers": [2, 3], "parallelism": "none", "degree": 1, "devices": [2]},
    {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [3]}]}

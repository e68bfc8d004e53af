"""A user model given to the CLI as ``--model tests.cli.user_models:mlp``."""

from torch import nn


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))


def mlp2() -> nn.Sequential:
    """Two layers: a profiling campaign of it on two devices is two runs (tests/cli/test_profile.py, multi-node)."""
    return nn.Sequential(nn.Sequential(nn.Linear(16, 32), nn.ReLU()), nn.Linear(32, 10))

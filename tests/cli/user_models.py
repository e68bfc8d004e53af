"""A user model given to the CLI as ``--model tests.cli.user_models:mlp``."""

from torch import nn


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))

"""A user model given to the CLI as ``--model tests.cli.user_models:mlp``."""

from torch import nn


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))


def mlp2() -> nn.Sequential:
    """Two layers: a profiling campaign of it on two devices is two runs (tests/cli/test_profile.py, multi-node)."""
    return nn.Sequential(nn.Sequential(nn.Linear(16, 32), nn.ReLU()), nn.Linear(32, 10))


def wide_head() -> nn.Sequential:
    """A narrow body and a 256-class head: at 64 rows per device the loss's log-softmax of the logits (64 x 256
    floats) outweighs the head's parameters (4 x 256 + 256), as a language model's loss does its head's
    (tests/predict/test_zero_stage.py, [Note: the loss runs outside every FSDP unit])."""
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4), nn.Linear(4, 256))

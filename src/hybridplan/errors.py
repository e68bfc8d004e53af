"""The project's exception types.

Every error caused by user input (a plan, a cluster file, a model name, a profile database) is a
:class:`HybridPlanError`: its message names the bad value, what was expected, and how to fix it. The
CLI prints it in one or two lines and exits with code 2, never with a traceback.
"""

from __future__ import annotations

__all__ = [
    "HybridPlanError",
    "PlanError",
    "ClusterError",
    "ModelError",
    "ProfileError",
    "UsageError",
    "LaunchError",
]


class HybridPlanError(Exception):
    """An error in user input.

    Args:
        message: what is wrong, naming the bad value and what was expected.
        fix: how to fix it (shown on a second line by the CLI).
    """

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message}\n  fix: {self.fix}"


class PlanError(HybridPlanError):
    """A plan file or plan object violates a rule (coverage, degrees, devices, batch sizes)."""


class ClusterError(HybridPlanError):
    """A cluster specification is malformed or inconsistent."""


class ModelError(HybridPlanError):
    """An unknown model, or a layer asked to do something it cannot (e.g. tensor parallelism)."""


class ProfileError(HybridPlanError):
    """A profile database is missing, malformed, or lacks the statistics a prediction needs."""


class UsageError(HybridPlanError):
    """A command-line option has a bad value or a bad combination of values."""


class LaunchError(HybridPlanError):
    """The machines of a multi-node run cannot be used: a host the launcher cannot reach, a rendezvous port
    already taken, an agent lost during a run (runtime/multinode.py)."""

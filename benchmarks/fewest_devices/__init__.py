"""The fewest devices that train a model, ours against a throughput-oriented planner.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.fewest_devices.run``.
"""

__all__: list[str] = []

"""The runs a profiling campaign needs, per scenario, against CAPTURE's Description 1.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.profiling_cost.run``.
"""

__all__: list[str] = []

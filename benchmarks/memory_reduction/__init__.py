"""Peak memory of the memory-optimal plan against the partitioners people use.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.memory_reduction.run``.
"""

__all__: list[str] = []

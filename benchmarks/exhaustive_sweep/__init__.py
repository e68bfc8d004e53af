"""Every plan of a small model on 4 devices, run: where our pick ranks.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.exhaustive_sweep.run``.
"""

__all__: list[str] = []

"""The largest trainable model at a fixed device memory, ours against time balancing.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.largest_model.run``.
"""

__all__: list[str] = []

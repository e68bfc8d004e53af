"""Prediction accuracy of per-device peak memory over random hybrid plans, on the real CPU runtime.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.capture_accuracy.run``.
"""

__all__: list[str] = []

"""Prediction error over random plans of Wide-ResNet 1B on a 4x4 mesh.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.prediction_error.run``.
"""

__all__: list[str] = []

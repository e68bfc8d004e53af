"""How fast a simulated device is, and how little host memory it needs.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.sim_speed.run``.
"""

__all__: list[str] = []

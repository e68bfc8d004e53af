"""Simulated against real CUDA peak memory, for plans that run on one GPU.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.sim_vs_gpu.run``.
"""

__all__: list[str] = []

"""AMP's 52 real runs on 16 T4 GPUs against our cost model, and the throughput search's planning time.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.amp_trials.run``.
"""

__all__: list[str] = []

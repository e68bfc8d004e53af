"""What the memory-optimal plan costs in throughput against the throughput-optimal plan.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.throughput_loss.run``.
"""

__all__: list[str] = []

"""How long the memory-minimising plan search takes.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.search_time.run``.
"""

__all__: list[str] = []

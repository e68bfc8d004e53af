"""Paper-size models end to end on simulated devices: profile, plan, validate.

See README.md; run from the repository root: ``.venv/bin/python -m benchmarks.paper_plans.run``.
"""

__all__: list[str] = []

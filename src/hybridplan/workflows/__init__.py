"""The end-to-end verbs that the command line, the report and the benchmarks share.

- :mod:`~hybridplan.workflows.validate`: run a plan and compare every device's measured peak with the prediction;
- :mod:`~hybridplan.workflows.runs`: profiles made once, plans run and paired with their predictions, results
  kept between runs of a long benchmark;
- :mod:`~hybridplan.workflows.sampling`: plans drawn uniformly from a plan space (prediction error over random
  plans, as CAPTURE measured it);
- :mod:`~hybridplan.workflows.stage_cache`: simulated measurements of many plans for the price of their
  distinct stages.
"""

__all__: list[str] = []

"""What the reproducible experiments under ``benchmarks/`` need beyond the library's main data flow.

- :mod:`~hybridplan.experiments.layer_costs`: per-layer parameters, FLOPs and bytes on fake tensors: the
  costs the baseline partitioners weigh, and a FLOP time profile where no measured one exists;
- :mod:`~hybridplan.experiments.sampling`: plans drawn uniformly from a plan space (prediction error over
  random plans, as CAPTURE measured it);
- :mod:`~hybridplan.experiments.stage_cache`: simulated measurements of many plans for the price of their
  distinct stages;
- :mod:`~hybridplan.experiments.runs`: profiles made once, plans run and paired with their predictions,
  results kept between runs of a long benchmark.
"""

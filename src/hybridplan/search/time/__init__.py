"""The time objective: the fastest plans that fit in memory (AMP, PipeDream-2BW).

- :mod:`~hybridplan.search.time.throughput`: AMP's search over (pp, dp, tp, mbs), and the Pareto frontier;
- :mod:`~hybridplan.search.time.bottleneck_cuts`: how the search cuts the layers into stages: branch and bound on
  the bottleneck values, the whole predicted iteration time (gradient sync included) minimised exactly;
  :mod:`~hybridplan.search.time.cut_problem` (one cut problem: the least sum under caps, by windows),
  :mod:`~hybridplan.search.time.window_minima` (the windows' minima), :mod:`~hybridplan.search.time.sync_costs`
  (the gradient sync of a stage's layers);
- :mod:`~hybridplan.search.time.stage_cuts`: the cut's objective, AMP's dynamic program (the reference the
  fast cut is tested against) and the min-max partition of PipeDream-2BW;
- :mod:`~hybridplan.search.time.rank_placement`: Megatron's rank placement, and simulated annealing of it;
- :mod:`~hybridplan.search.time.pipedream_2bw`: PipeDream-2BW's planner over (w, d, b, r);
- :mod:`~hybridplan.search.time.feasibility`: which plans the model can run and fit in memory (the filter every
  time search applies; imports torch to check the model's layer rules).

Nothing is imported here: the modules are imported where used (feasibility needs torch; the rest do not).
"""

__all__: list[str] = []

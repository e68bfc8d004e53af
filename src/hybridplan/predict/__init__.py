"""Prediction from measured profiles: per-device peak memory and iteration time of any plan.

- :mod:`~hybridplan.predict.memory`: the memory predictor (CAPTURE's statistics, replayed through the plan's
  schedule at each stage's position; degree fits; composite stages); the statistics at the plan's batch in
  :mod:`~hybridplan.predict.batch_scaling`, a ZeRO stage's per-rank peaks in :mod:`~hybridplan.predict.zero_stage`
  (on :mod:`~hybridplan.predict.zero_layout`'s layout and the rules of :mod:`~hybridplan.predict.zero3_transients`
  and :mod:`~hybridplan.predict.zero2_replay`), the plans it refuses in
  :mod:`~hybridplan.predict.plan_checks`, its result in :mod:`~hybridplan.predict.prediction`, its view on merged
  layers in :mod:`~hybridplan.predict.unit_view`; the CUDA allocator's reserved peak in
  :mod:`~hybridplan.predict.reserved`;
- :mod:`~hybridplan.predict.stash`: the PipeDream-2BW weight stash, added to or removed from a profile taken
  under the other schedule family;
- :mod:`~hybridplan.predict.time_model`: AMP's cost model of the iteration time;
  its per-stage terms in :mod:`~hybridplan.predict.stage_compute` (what a stage computes) and
  :mod:`~hybridplan.predict.communication` (what it sends), its result in :mod:`~hybridplan.predict.time_breakdown`.

predict/ only reads profiles (profiling/) and plans (plan/): it runs nothing.
"""

__all__: list[str] = []

"""Profiling: what hybridplan measures, and the files it writes and reads.

The memory profile, in the order a campaign makes it:

- :mod:`~hybridplan.profiling.partitions`: which spans of layers to profile, packed into runs (CAPTURE's
  Description 1); :mod:`~hybridplan.profiling.campaign`: the campaign (resume, substitution of failed spans,
  progress); :mod:`~hybridplan.profiling.auxiliary_tables`: the tables it records on fake tensors (weight stash,
  tensor shards, the loss's backward); :mod:`~hybridplan.profiling.execution`: one run, real or simulated;
- :mod:`~hybridplan.profiling.store`: the SQLite file, written as each run ends;
  :mod:`~hybridplan.profiling.database`: the same file as its readers see it (read only, opened once);
- :mod:`~hybridplan.profiling.quantities`: the eight position-free memory quantities of a stage;
  :mod:`~hybridplan.profiling.schedule_memory`: their replay through a schedule;
  :mod:`~hybridplan.profiling.statistics`: per-layer M_i / M_a; :mod:`~hybridplan.profiling.merger`:
  CAPTURE's layer merger; :mod:`~hybridplan.profiling.stash_sizes`: per-layer PipeDream-2BW stash bytes.

The time profile: :mod:`~hybridplan.profiling.timing` measures layer times on the runtime,
:mod:`~hybridplan.profiling.time_profile` holds them (per layer :mod:`~hybridplan.profiling.layer_info`, per
measured size :mod:`~hybridplan.profiling.timing_table`), :mod:`~hybridplan.profiling.time_profile_json` is their
file format, :mod:`~hybridplan.profiling.stored_time_profile` reads a database's times,
:mod:`~hybridplan.profiling.importers` reads PipeDream's and AMP's profiles, and
:mod:`~hybridplan.profiling.layer_costs` counts per-layer parameters, FLOPs and bytes on fake tensors.
"""

__all__: list[str] = []

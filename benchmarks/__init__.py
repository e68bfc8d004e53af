"""The experiments: one folder per experiment, each with its ``run.py`` and a README (what is measured, the
exact command, the machine, the measured table).

Every script runs as a module from the repository root::

    .venv/bin/python -m benchmarks.<folder>.run --help

- ``amp_trials``: AMP's 52 real runs on 16 T4 GPUs against our cost model; the throughput search's planning time.
- ``capture_accuracy``: per-device peak-memory prediction error over random hybrid plans, real CPU runtime.
- ``exhaustive_sweep``: every plan of a small model on 4 devices, run: where our pick ranks.
- ``fewest_devices``: the fewest devices that train a model, ours against a throughput-oriented planner.
- ``largest_model``: the widest model that fits a fixed device memory, ours against time balancing
  (``largest_model.scalable``: the Wide-ResNet family of any width).
- ``memory_reduction``: peak memory of the memory-optimal plan against the partitioners people use.
- ``paper_plans``: paper-size models end to end on simulated devices: profile, plan, validate.
- ``prediction_error``: prediction error over random plans of Wide-ResNet 1B on a 4x4 mesh.
- ``profiling_cost``: the runs a profiling campaign needs, against CAPTURE's Description 1.
- ``search_time``: how long the memory-minimising plan search takes, 1x4 to 32x8 meshes.
- ``sim_speed``: how fast a simulated device is and the host memory it needs (``sim_speed.paper_plans``:
  paper-size plans simulated).
- ``sim_vs_gpu``: simulated against real CUDA peak memory, for single-GPU plans.
- ``throughput_loss``: what the memory-optimal plan costs in throughput against the throughput-optimal one.

:mod:`benchmarks.paper_profiles` holds the paper-size models and settings several experiments share, and
makes their profiles (``python -m benchmarks.paper_profiles``).
"""

__all__: list[str] = []

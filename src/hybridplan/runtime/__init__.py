"""The runtime: executes a plan, on real processes or simulated devices, and measures it.

A tour of its files in the order a run goes through them:

- :mod:`~hybridplan.runtime.config`: ``RunConfig``, the run (model, plan, cluster, training
  settings), checked when it is made; ``validate_config`` adds the checks that need the model.
- :mod:`~hybridplan.runtime.launch`: ``launch``, the front door: hands the run to its backend.
- The backends, which start the ranks:

  - :mod:`~hybridplan.runtime.processes`: one local process per device through a forkserver; watches
    them, stops them all at the first failure and finds its root cause;
    :mod:`~hybridplan.runtime.worker` is such a process, and :mod:`~hybridplan.runtime.lifeline` ends it
    when the launcher dies, however it dies;
  - :mod:`~hybridplan.runtime.sim`: simulated devices, one after the other in this process, on fake
    tensors and torch's fake process group;
  - :mod:`~hybridplan.runtime.torchrun`: the entry point of processes torchrun starts on several
    machines (``hybridplan run --write-config``);
  - :mod:`~hybridplan.runtime.multinode`: runs on several machines from one head (``hybridplan
    profile --hosts``): a node agent per host (:mod:`~hybridplan.runtime.node`) starts torchrun there for
    each run; :mod:`~hybridplan.runtime.hosts` reads host lists, SLURM node lists and launcher templates.

- :mod:`~hybridplan.runtime.rank`: what every rank does, whoever started it: build the stage, train
  it, return its report.

  - :mod:`~hybridplan.runtime.stage`: the stage's layers, split for tensor parallelism, checkpointed
    if asked;
  - :mod:`~hybridplan.runtime.precision`: fp32 or mixed precision, and the optimizer;
  - :mod:`~hybridplan.runtime.memory`: the meters that count peak tensor memory (exact storage tracker,
    CUDA allocator counters); :mod:`~hybridplan.runtime.gpu_memory`: a simulated CUDA device (tensor
    peak, reserved peak, memory outside the allocator), over :mod:`~hybridplan.runtime.cuda_allocator`,
    a replay of PyTorch's caching allocator;
  - :mod:`~hybridplan.runtime.executor`: the training loop of one rank: schedule actions, transfers
    between stages (:mod:`~hybridplan.runtime.routing`; staged through host memory when several ranks
    share a GPU, :mod:`~hybridplan.runtime.shared_gpu`), releasing sent outputs
    (:mod:`~hybridplan.runtime.release`), PipeDream-2BW's weight versions
    (:mod:`~hybridplan.runtime.weight_stash`), gradient sync, step;
    :mod:`~hybridplan.runtime.layer_timer` times every layer if asked.

- :mod:`~hybridplan.runtime.result`: the typed reports ranks end with, their exit codes, and
  ``aggregate``, which makes the ``RunResult`` (one JSON form for both backends), or ``root_cause``
  for a failed run.

The tensors that cross a stage's boundaries are the model's (models/boundaries.py), as is the zoo that
resolves a model's name (models/zoo.py). Imports run one way through these files: nothing imports
the front door, processes.py and sim.py do not import each other, and the import graph has no cycle
(tests/test_architecture.py).

Import from the modules (``from hybridplan.runtime.launch import launch``): the package itself exports
nothing, so that importing one file (a rank process imports the few it runs) imports no other, and
``hybridplan.runtime.launch`` is always the module, never the function of the same name.
"""

__all__: list[str] = []

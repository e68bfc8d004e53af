"""The partitioners people use today, as baselines for the memory-minimising search.

Each cuts a chain of ``L`` layers into pipeline stages and returns the stage boundaries
``(0, b_1, ..., L)`` (stage ``j`` holds layers ``[b_j, b_{j+1})``, as in
:class:`~hybridplan.search.time.stage_cuts.Assignment`). None looks at memory, which is the point of comparing.
Our own implementations of the upstream algorithms, reproducing their results, tie-breaks included:

- :func:`equal_layers`: equal layer counts. Megatron-LM gives every pipeline rank ``num_layers // pp``
  layers and rejects a remainder (``megatron/training/arguments.py``: "Number of layers should be divisible
  by the pipeline-model-parallel size"); Alpa's ``UniformStageOption``
  (``alpa/pipeline_parallel/stage_construction.py``) gives every stage ``devices / pp`` devices and one of
  the layers its layer construction made (``pp`` clusters of about equal FLOPs: equal counts of identical
  blocks). A remainder goes one layer each to the FIRST stages, as DeepSpeed's
  ``partition_method="uniform"`` does (``deepspeed/runtime/utils.py`` ``partition_uniform``, since
  DeepSpeed PR #4053; before it the whole remainder went to the last stage).
- :func:`balance_by_time`, :func:`balance_by_size`: torchgpipe (``torchgpipe/balance/__init__.py``,
  ``utils.py`` ``balance_cost``, ``blockpartition.py`` ``solve``). [Note: torchgpipe's block partition]
- :func:`balance_by_parameters`, :func:`balance_by_type`: DeepSpeed ``PipelineModule``
  ``partition_method="parameters"`` / ``"type:[regex]"`` (``deepspeed/runtime/pipe/module.py``
  ``_partition_layers``, ``deepspeed/runtime/utils.py`` ``partition_balanced``). [Note: DeepSpeed's DP]

[Note: torchgpipe's block partition] Bárány et al., "Block partitions of sequences" (arXiv 1308.2452), as
torchgpipe codes it. Costs are scaled to ``[0, 1]`` by ``(c - min) / (max - min)`` (all zero when equal);
blocks start at ``L // k`` layers with the remainder in the last. Repeat: ``p`` = the heaviest block (ties:
the highest index); then ``q`` = the lightest (ties: the lowest index); stop when ``size(p) <= size(q) + 1``;
else move one layer into ``q`` from its neighbour ``h`` on ``p``'s side; if ``h == p`` pick ``p`` anew, else
find ``q`` again (``size(p)`` kept). It is NOT the min-max optimum; it guarantees only max - min <= 1 in
scaled units. On ties at the smallest cost (which scales to 0) torchgpipe's code (``q`` by lowest index, not
nearest ``p`` as the paper says) can return an empty block (``[0, 0, 1, 1]`` in 3 -> sizes 3, 0, 1, which
``GPipe`` rejects) or move a boundary past the model's end and never stop; we raise :class:`PlanError` for
both. (Checked against a transliteration of torchgpipe's code on 110,000 random inputs, L <= 30: the same
boundaries or the same failure every time; no run that stopped ever had a boundary outside ``[0, L]``.)

[Note: DeepSpeed's DP] Since DeepSpeed PR #4312 (2023; it replaced a bisection on the heaviest stage),
``partition_balanced`` keeps, for the first ``i`` layers in ``j`` stages, ONE candidate: the previous cut
``c`` minimising ``max(M, s) - min(m, s)`` where ``(M, m)`` are the heaviest and lightest stage of the
candidate kept for ``(c, j - 1)`` and ``s`` the weight of layers ``[c, i)``; ties go to the LARGEST ``c``.
This greedy spread is not the optimum of max - min, nor of the max. Weights are summed like numpy
(integers exactly, else as floats in order) and compared as float64. ``L == k``: one layer per stage.
(Same boundaries as a transliteration of DeepSpeed's code on the 110,000 inputs above.)
"""

from __future__ import annotations

from typing import Literal

import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate

from hybridplan.errors import PlanError, UsageError
from hybridplan.plan import Cluster, Parallelism, Plan, StagePlan, as_schedule

__all__ = ["BASELINES", "equal_layers", "balance_by_time", "balance_by_size", "balance_by_parameters",
           "balance_by_type", "baseline_plan", "uniform_3d_shapes", "uniform_3d_plan"]

BASELINES: Mapping[str, str] = {
    "equal": "equal layer counts per stage (Megatron-LM, Alpa uniform stages; remainder to the first stages)",
    "torchgpipe-time": "torchgpipe balance_by_time: block partition of per-layer seconds (torchgpipe 0.0.7's"
    " profile_times times each layer's forward and backward together)",
    "torchgpipe-size": "torchgpipe balance_by_size: block partition of per-layer bytes"
    " (activation bytes per sample x micro-batch samples + parameter bytes x param_scale, default 2)",
    "deepspeed-parameters": 'DeepSpeed PipelineModule partition_method="parameters": partition_balanced'
    " of per-layer trainable parameter counts",
}
"""The baselines :func:`baseline_plan` builds, name -> what it does and which per-layer costs it needs."""

_STALL_STEPS_PER_LAYER_STAGE = 64
"""Backstop on torchgpipe's loop: steps allowed per layer x stage. Runs that stop took at most ~4 L steps in
our random trials (L <= 24); the boundary check in :func:`_block_partition` catches the endless ones first."""


def _check_stages(num_layers: int, num_stages: int) -> None:
    for value, what in ((num_layers, "number of layers"), (num_stages, "number of stages")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"the {what} must be a positive integer, got {value!r}")
    if num_stages > num_layers:
        raise PlanError(
            f"cannot cut {num_layers} layers into {num_stages} non-empty stages",
            fix="use at most one stage per layer: fewer devices, or several devices per stage (a hybrid plan)",
        )


def _check_costs(costs: Iterable[float], what: str, num_stages: int) -> list[float]:
    """The costs as a list (ints kept: DeepSpeed sums them exactly), checked finite and >= 0."""
    given = list(costs) if isinstance(costs, Iterable) and not isinstance(costs, (str, bytes, Mapping)) else []
    if not given:
        raise PlanError(f"{what} must be a non-empty list of per-layer costs, got {costs!r}", fix="give one cost per layer")
    out: list[float] = []
    for i, c in enumerate(given):
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or not math.isfinite(c) or c < 0:
            raise PlanError(
                f"{what}[{i}] = {c!r} is not a finite number >= 0",
                fix="costs are seconds, bytes or parameter counts: finite and non-negative",
            )
        out.append(int(c) if isinstance(c, numbers.Integral) else float(c))
    _check_stages(len(out), num_stages)
    return out


def equal_layers(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Equal layer counts per stage, the remainder one layer each to the first stages (module docstring).

    Raises:
        PlanError: for non-positive counts or more stages than layers.

    Example:
        >>> equal_layers(8, 4), equal_layers(10, 4)
        ((0, 2, 4, 6, 8), (0, 3, 6, 8, 10))
    """
    _check_stages(num_layers, num_stages)
    base, extra = divmod(num_layers, num_stages)
    return tuple(accumulate((base + 1 if j < extra else base for j in range(num_stages)), initial=0))


def _block_partition(costs: Iterable[float], num_stages: int, what: str) -> tuple[int, ...]:
    """torchgpipe's ``blockpartition.solve`` ([Note: torchgpipe's block partition])."""
    values = _check_costs(costs, what, num_stages)
    n, k = len(values), num_stages
    low, spread = min(values), max(values) - min(values)
    unit = [0.0] * n if spread == 0 else [(c - low) / spread for c in values]
    ends = [n // k * (j + 1) for j in range(k - 1)] + [n]  # ends[j]: where block j stops

    def size(j: int) -> float:  # Python slicing and sum() exactly as upstream, so ties fall the same way
        return sum(unit[ends[j - 1] if j else 0 : ends[j]])

    heaviest, p = 0.0, 0
    pick_p = True
    for _ in range(_STALL_STEPS_PER_LAYER_STAGE * n * k):
        sizes = [(size(j), j) for j in range(k)]
        if pick_p:
            heaviest, p = max(sizes)
        lightest, q = min(sizes)
        if heaviest <= lightest + 1:
            bounds = (0, *ends)
            empty = [j for j in range(k) if bounds[j + 1] <= bounds[j]]
            if empty:
                raise PlanError(
                    f"torchgpipe's block partition of {what} into {k} stages leaves stage(s) {empty} without layers"
                    f" (boundaries {list(bounds)}); torchgpipe's GPipe rejects such a balance",
                    fix="this happens when several layers tie at the smallest cost: use another baseline or fewer stages",
                )
            return bounds
        if p < q:  # the last layer of block h = q - 1 moves into q
            h = moved = q - 1
            ends[moved] -= 1
        else:  # the first layer of block h = q + 1 moves into q
            h, moved = q + 1, q
            ends[moved] += 1
        if not 0 <= ends[moved] <= n:
            break
        pick_p = h == p
    raise PlanError(
        f"torchgpipe's block partition of {what} into {k} stages does not converge: a boundary leaves the model"
        " (torchgpipe's loop runs forever on this input)",
        fix="this happens when several layers tie at the smallest cost: use another baseline or fewer stages",
    )


def balance_by_time(layer_times: Iterable[float], num_stages: int) -> tuple[int, ...]:
    """torchgpipe's ``balance_by_time``: block partition of per-layer seconds (torchgpipe 0.0.7 profiles each
    layer's forward and backward together, as integer microseconds, ``torchgpipe/balance/profile.py``
    ``profile_times``; the result depends on ``(t - min) / (max - min)`` only).

    Raises:
        PlanError: for bad costs or counts, or where torchgpipe's partition fails ([Note: torchgpipe's block
            partition]).

    Example (torchgpipe's ``tests/test_balance.py``: delays of 1..6 centiseconds make balance ``[4, 2]``):
        >>> balance_by_time([0.01, 0.02, 0.03, 0.04, 0.05, 0.06], 2)
        (0, 4, 6)
    """
    return _block_partition(layer_times, num_stages, "layer_times")


def balance_by_size(layer_sizes: Iterable[float], num_stages: int) -> tuple[int, ...]:
    """torchgpipe's ``balance_by_size``: block partition of per-layer bytes. torchgpipe measures each layer's
    CUDA memory growth for one sample times the micro-batch samples, plus its parameter bytes x
    ``param_scale`` (default 2.0, for SGD with momentum; ``torchgpipe/balance/profile.py`` ``profile_sizes``).

    Raises:
        PlanError: as :func:`balance_by_time`.

    Example (torchgpipe's ``tests/test_balance.py``: growing then shrinking activations):
        >>> balance_by_size([1, 2, 3, 4, 5, 6], 2), balance_by_size([6, 5, 4, 3, 2, 1], 2)
        ((0, 4, 6), (0, 2, 6))
    """
    return _block_partition(layer_sizes, num_stages, "layer_sizes")


def balance_by_parameters(parameter_counts: Iterable[float], num_stages: int) -> tuple[int, ...]:
    """DeepSpeed's ``partition_balanced`` of per-layer parameter counts ([Note: DeepSpeed's DP]).

    Raises:
        PlanError: for bad counts (negative, empty) or more stages than layers.

    Example (DeepSpeed's ``tests/unit/runtime/utils/test_partition.py``):
        >>> balance_by_parameters([0, 1, 2, 3, 3, 3], 4), balance_by_parameters([0.0, 1.1, 30, 3.0], 3)
        ((0, 3, 4, 5, 6), (0, 2, 3, 4))
    """
    weights = _check_costs(parameter_counts, "parameter_counts", num_stages)
    n, k = len(weights), num_stages
    if n == k:
        return tuple(range(n + 1))
    if not all(isinstance(w, int) for w in weights):  # numpy's cumsum: integers exactly, else floats in order
        weights = [float(w) for w in weights]
    prefix, total = [0.0], weights[0] * 0
    for w in weights:
        total += w
        prefix.append(float(total))
    inf = math.inf
    # (spread, heaviest, lightest, previous cut) of the candidate kept for the first i layers in j stages
    kept: list[list[tuple[float, float, float, int]]] = [[(inf, inf, inf, 0)] * (n + 1) for _ in range(k + 1)]
    kept[0][0] = (0.0, 0.0, inf, 0)
    for i in range(1, n + 1):
        for j in range(1, min(i, k) + 1):
            best = kept[j][i]
            for c in range(0 if j == 1 else j - 1, 1 if j == 1 else i):  # cuts with a candidate for (c, j - 1)
                s = prefix[i] - prefix[c]
                _, hi, lo, _ = kept[j - 1][c]
                spread = max(hi, s) - min(lo, s)
                if best[0] >= spread:  # >=: ties go to the later cut, as upstream
                    best = (spread, max(hi, s), min(lo, s), c)
            kept[j][i] = best
    bounds = [n]
    for j in range(k, 0, -1):
        bounds.append(kept[j][bounds[-1]][3])
    return tuple(reversed(bounds))


def balance_by_type(layer_names: Sequence[str], pattern: str, num_stages: int) -> tuple[int, ...]:
    """DeepSpeed's ``partition_method="type:[regex]"``: :func:`balance_by_parameters` of weights 1 for the
    layers whose class name matches ``pattern`` (``re.search``, case-insensitive; DeepSpeed lower-cases the
    method string first), 0 for the others (``module.py`` ``_find_layer_type``).

    Example (Megatron-DeepSpeed's ``type:transformer``):
        >>> balance_by_type(["Embedding"] + ["TransformerLayer"] * 4 + ["LMHead"], "transformer", 2)
        (0, 3, 6)
    """
    regex = re.compile(pattern.lower(), re.IGNORECASE)
    return balance_by_parameters([1 if regex.search(name) else 0 for name in layer_names], num_stages)


_PARTITIONERS: dict[str, Callable[[list[float], int], tuple[int, ...]]] = {
    "torchgpipe-time": balance_by_time,
    "torchgpipe-size": balance_by_size,
    "deepspeed-parameters": balance_by_parameters,
}


def baseline_plan(
    name: str,
    *,
    num_layers: int,
    cluster: Cluster,
    schedule: str,
    global_batch_size: int,
    num_microbatches: int,
    layer_costs: Iterable[float] | None = None,
    stage_degrees: int | None = None,
    parallelism: Literal["data", "tensor"] = "data",
) -> Plan:
    """The plan a baseline partitioner gives on ``cluster``, valid by :meth:`Plan.validate`.

    By default pipeline-only: one stage per device, ``cluster.num_devices`` stages. With ``stage_degrees=d``
    (Alpa's uniform stages: ``pp`` stages of ``d`` devices each, ``pp * d`` = the devices), every stage runs
    ``parallelism`` ("data" or "tensor") on ``d`` devices. Stage ``j`` takes devices ``[j d, (j + 1) d)``, so
    a stage stays inside a node when ``d`` divides the devices per node.

    Args:
        name: a key of :data:`BASELINES`.
        layer_costs: one cost per layer, for every baseline but "equal" (see :data:`BASELINES`).
        stage_degrees: devices per stage (default 1).
        parallelism: "data" or "tensor", of the stages when ``stage_degrees > 1`` (degree-1 stages are "none").

    Raises:
        UsageError: for an unknown baseline or parallelism.
        PlanError: for a degree that does not tile the nodes, more stages than layers, missing or bad costs,
            or a batch the plan cannot split (the :meth:`Plan.validate` rules).

    Example:
        >>> plan = baseline_plan("equal", num_layers=10, cluster=Cluster.uniform(2, 2), schedule="1f1b",
        ...                      global_batch_size=8, num_microbatches=4)
        >>> [(s.start, s.stop, s.devices) for s in plan.stages]
        [(0, 3, (0,)), (3, 6, (1,)), (6, 8, (2,)), (8, 10, (3,))]
    """
    if name not in BASELINES:
        raise UsageError(f"unknown baseline {name!r}", fix=f"use one of {list(BASELINES)}")
    degree = 1 if stage_degrees is None else stage_degrees
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise PlanError(f"stage_degrees must be a positive integer, got {stage_degrees!r}")
    if parallelism not in ("data", "tensor"):
        raise UsageError(f"unknown stage parallelism {parallelism!r}", fix="use 'data' or 'tensor'")
    k = cluster.devices_per_node
    if k % degree:
        raise PlanError(
            f"stages of {degree} devices do not tile nodes of {k} devices (cluster {cluster.shape}): a stage would span nodes",
            fix=f"use a stage degree dividing {k}: {[d for d in range(1, k + 1) if k % d == 0]}",
        )
    stages = cluster.num_devices // degree
    if isinstance(num_layers, int) and not isinstance(num_layers, bool) and 1 <= num_layers < stages:
        fits = [d for d in range(degree, k + 1) if k % d == 0 and cluster.num_devices // d <= num_layers]
        per = "device" if degree == 1 else f"{degree} devices"
        raise PlanError(
            f"baseline {name!r} makes one pipeline stage per {per}: {stages} stages on cluster {cluster.shape},"
            f" but the model has only {num_layers} layers",
            fix="use a hybrid plan (several devices per stage; hybridplan's search does this)"
            + (f", e.g. stage_degrees={fits[0]}" if fits else "")
            + f", or at most {num_layers * degree} devices",
        )
    if name == "equal":
        bounds = equal_layers(num_layers, stages)
    else:
        if layer_costs is None:
            raise PlanError(f"baseline {name!r} needs layer_costs", fix=f"pass one cost per layer: {BASELINES[name]}")
        costs = _check_costs(layer_costs, "layer_costs", 1)
        _check_stages(num_layers, stages)
        if len(costs) != num_layers:
            raise PlanError(
                f"layer_costs has {len(costs)} entries but the model has {num_layers} layers",
                fix="give one cost per layer",
            )
        bounds = _PARTITIONERS[name](costs, stages)
    kind: Parallelism = parallelism if degree > 1 else "none"
    plan = Plan(
        schedule=as_schedule(schedule),
        global_batch_size=global_batch_size,
        num_microbatches=num_microbatches,
        stages=tuple(
            StagePlan(bounds[j], bounds[j + 1], kind, degree, tuple(range(j * degree, (j + 1) * degree)))
            for j in range(stages)
        ),
        extra={"baseline": name},
    )
    plan.validate(num_layers=num_layers, cluster=cluster)
    return plan


def uniform_3d_shapes(cluster: Cluster, num_layers: int) -> list[tuple[int, int, int]]:
    """Every ``(pipeline, tensor, data)`` degree triple of a Megatron-style 3D plan on ``cluster``: the degrees
    multiply to the devices, a tensor group fits in a node (``tensor`` divides the devices per node, as
    Megatron-LM places tensor ranks on one node's NVLink), a stage's ``tensor x data`` devices tile the nodes
    (divide or are a multiple of a node's devices), and there are at most ``num_layers`` stages. Ordered by
    pipeline, then tensor degree.

    Example:
        >>> uniform_3d_shapes(Cluster.uniform(2, 2), 8)
        [(1, 1, 4), (1, 2, 2), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    """
    n, k = cluster.num_devices, cluster.devices_per_node
    out = []
    for pp in range(1, min(n, num_layers) + 1):
        if n % pp:
            continue
        for tp in range(1, k + 1):
            if k % tp or (n // pp) % tp:
                continue
            width = n // pp
            if k % width and width % k:
                continue
            out.append((pp, tp, width // tp))
    return out


def uniform_3d_plan(*, num_layers: int, cluster: Cluster, pipeline: int, tensor: int, schedule: str,
                    global_batch_size: int, num_microbatches: int, zero: int = 1) -> Plan:
    """The Megatron-style 3D plan: ``pipeline`` stages of equal layer counts (:func:`equal_layers`), each on
    ``tensor x data`` devices, tensor-parallel inside a node and data-parallel across (the stage's devices
    ``tensor``-fastest, as Megatron-LM orders ranks: tensor, then data, then pipeline; ``megatron/core/
    parallel_state.py`` ``initialize_model_parallel``), with ZeRO ``zero`` over each stage's data group where
    it has one (Megatron's distributed optimizer is ZeRO-1: ``--use-distributed-optimizer``). A stage wider
    than a node spans whole nodes along its data dimension.

    Raises:
        PlanError: for degrees that do not fill the cluster, a tensor group across nodes, or the
            :meth:`Plan.validate` rules (e.g. a micro-batch the data degree does not split).

    Example:
        >>> plan = uniform_3d_plan(num_layers=6, cluster=Cluster.uniform(2, 2), pipeline=2, tensor=2,
        ...                        schedule="1f1b", global_batch_size=8, num_microbatches=2)
        >>> [(s.start, s.stop, s.kind, s.devices, s.zero) for s in plan.stages]
        [(0, 3, 'tensor', (0, 1), 0), (3, 6, 'tensor', (2, 3), 0)]
    """
    n = cluster.num_devices
    for value, what in ((pipeline, "pipeline"), (tensor, "tensor")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or n % value:
            raise PlanError(f"the {what} degree must be a positive divisor of the {n} devices, got {value!r}",
                            fix=f"use one of {[d for d in range(1, n + 1) if n % d == 0]}")
    width = n // pipeline
    if width % tensor:
        raise PlanError(f"a stage of {width} devices does not split into tensor groups of {tensor}",
                        fix="use a tensor degree dividing the devices per stage")
    data = width // tensor
    kind: Parallelism = ("data+tensor" if data > 1 and tensor > 1 else "data" if data > 1
                         else "tensor" if tensor > 1 else "none")
    bounds = equal_layers(num_layers, pipeline)
    plan = Plan(
        schedule=as_schedule(schedule),
        global_batch_size=global_batch_size,
        num_microbatches=num_microbatches,
        stages=tuple(
            StagePlan(bounds[j], bounds[j + 1], kind, width, tuple(range(j * width, (j + 1) * width)),
                      tensor_degree=tensor if kind == "data+tensor" else 0, zero=zero if data > 1 else 0)
            for j in range(pipeline)
        ),
        extra={"baseline": f"megatron-3d pp{pipeline} tp{tensor} dp{data}" + (f" zero{zero}" if data > 1 and zero else "")},
    )
    plan.validate(num_layers=num_layers, cluster=cluster)
    return plan

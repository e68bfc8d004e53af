"""The rules of a plan (:meth:`~hybridplan.plan.plan.Plan.validate`), and the fewer the cost model needs
(:meth:`~hybridplan.plan.plan.Plan.check_fits`).

- stages cover every layer once, in order: the first starts at 0, each starts where the previous
  stopped, the last stops at the model's layer count;
- "none" has degree 1; ``len(devices) == degree``; the data degree divides the micro-batch size;
  ``zero`` (ZeRO sharding: 0, 1 optimizer state, 2 + gradients, 3 + parameters) needs a data degree above 1;
  ``recompute`` is "none", "full" (activation checkpointing of every layer of the stage) or "selective"
  (torchtitan's per-operation policy, plan/stage.py);
- every device of the cluster belongs to exactly one stage, and a tensor-parallel group never spans
  nodes; a stage's data-parallel replicas may (CAPTURE's plan space, seed 000 III-C, keeps whole stages on
  one node: that is a rule of its search, search/memory/space.py, not of plans);
- the global batch splits into ``num_microbatches`` equal micro-batches;
- every layer of a tensor-parallel stage supports tensor parallelism at that degree.

:func:`check_fits` checks only what the cost model needs (coverage, existing devices): AMP's plans
may place a stage's replicas on several nodes. This module imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridplan.errors import PlanError

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel
    from hybridplan.plan.cluster import Cluster
    from hybridplan.plan.plan import Plan

__all__ = ["validate", "check_fits"]


def validate(
    plan: Plan,
    *,
    num_layers: int | None = None,
    cluster: Cluster | None = None,
    model: LayeredModel | None = None,
) -> None:
    """Check every rule of the plan space (module docstring) that the given context allows.

    Args:
        plan: the plan to check.
        num_layers: the model's layer count (taken from ``model`` when given).
        cluster: the mesh the plan must fill exactly.
        model: the model, to check tensor-parallel support of tensor stages' layers.

    Raises:
        PlanError: naming the first broken rule, the bad value and the fix.
    """
    _validate_batch(plan)
    if model is not None:
        num_layers = model.num_layers
    _validate_layers(plan, num_layers)
    _validate_stage_kinds(plan)
    _validate_devices(plan, cluster)
    if model is not None:
        g = model.sample_granularity
        for i, s in enumerate(plan.stages):
            rows = plan.microbatch_size // s.data_degree
            if rows % g:
                raise PlanError(
                    f"stage {i} ({s.describe()}) would process {rows} samples per micro-batch on each device,"
                    f" but {model.name} needs a multiple of {g}",
                    fix=f"choose a global batch and micro-batch count giving micro-batches (and data-parallel shards) of a multiple of {g} samples",
                )
            if s.tensor_degree > 1:
                for layer in s.layers:
                    problem = model.tensor_parallel_problem(layer, s.tensor_degree)
                    if problem is not None:
                        raise PlanError(
                            f"stage {i} ({s.describe()}): layer {layer} ({model.layer_name(layer)}) cannot be"
                            f" tensor-parallel at degree {s.tensor_degree}: {problem}",
                            fix="make this stage 'data' or 'none', or move the layer to another stage",
                        )


def check_fits(plan: Plan, num_layers: int, cluster: Cluster) -> None:
    """What the cost model needs, short of :func:`validate`'s plan-space rules: the stages cover
    ``num_layers`` and use only devices of ``cluster`` (AMP's plans may spread replicas over nodes).

    Raises:
        PlanError: naming the problem.
    """
    _validate_layers(plan, num_layers)
    bad = [d for s in plan.stages for d in s.devices if not 0 <= d < cluster.num_devices]
    if bad:
        raise PlanError(
            f"device(s) {bad} do not exist on cluster {cluster.shape} (devices 0..{cluster.num_devices - 1})",
            fix="use device indices of the cluster, or a larger cluster",
        )


def _validate_batch(plan: Plan) -> None:
    if plan.global_batch_size < 1:
        raise PlanError(f"global_batch_size must be at least 1, got {plan.global_batch_size}")
    if plan.num_microbatches < 1:
        raise PlanError(f"num_microbatches must be at least 1, got {plan.num_microbatches}")
    if plan.global_batch_size % plan.num_microbatches:
        raise PlanError(
            f"global_batch_size {plan.global_batch_size} does not split into {plan.num_microbatches} equal micro-batches",
            fix="choose num_microbatches dividing the global batch size",
        )


def _validate_layers(plan: Plan, num_layers: int | None) -> None:
    expected = 0
    for i, s in enumerate(plan.stages):
        if s.start != expected:
            what = "start at layer 0" if i == 0 else f"start where stage {i - 1} stops (layer {expected})"
            raise PlanError(
                f"stage {i} covers layers [{s.start}, {s.stop}) but must {what}",
                fix="stages must cover every layer once, in order, with half-open [start, stop) ranges",
            )
        if s.stop <= s.start:
            raise PlanError(f"stage {i} covers layers [{s.start}, {s.stop}), which is empty", fix="every stage needs stop > start")
        expected = s.stop
    if num_layers is not None and expected != num_layers:
        raise PlanError(
            f"the stages cover layers [0, {expected}) but the model has {num_layers} layers",
            fix=f"the last stage must stop at layer {num_layers}",
        )


def _validate_stage_kinds(plan: Plan) -> None:
    for i, s in enumerate(plan.stages):
        if s.degree < 1:
            raise PlanError(f"stage {i}: degree must be at least 1, got {s.degree}")
        if s.parallelism == "none" and s.degree != 1:
            raise PlanError(
                f"stage {i}: parallelism 'none' needs degree 1, got {s.degree}",
                fix="use 'data' or 'tensor' for a stage on several devices",
            )
        if len(s.devices) != s.degree:
            raise PlanError(
                f"stage {i}: degree {s.degree} but {len(s.devices)} device(s) {list(s.devices)}",
                fix="list exactly 'degree' devices",
            )
        if s.zero and s.data_degree < 2:
            raise PlanError(
                f"stage {i} ({s.describe()}): ZeRO-{s.zero} shards over the data-parallel group, and the stage has"
                " no data parallelism",
                fix='drop "zero", or make the stage data-parallel ("data" or "data+tensor" with a data degree above 1)',
            )
        if s.data_degree > 1 and plan.microbatch_size % s.data_degree:
            raise PlanError(
                f"stage {i}: data-parallel degree {s.data_degree} does not divide the micro-batch size {plan.microbatch_size}"
                f" (global batch {plan.global_batch_size} / {plan.num_microbatches} micro-batches)",
                fix="choose a batch size or micro-batch count giving a micro-batch divisible by every data-parallel degree",
            )


def _validate_devices(plan: Plan, cluster: Cluster | None) -> None:
    seen: dict[int, int] = {}
    for i, s in enumerate(plan.stages):
        twice = sorted({d for d in s.devices if s.devices.count(d) > 1})
        if twice:
            raise PlanError(f"device {twice[0]} appears twice in stage {i}", fix="list each device of a stage once")
        for d in s.devices:
            if d < 0:
                raise PlanError(f"stage {i}: device index {d} is negative")
            if d in seen:
                raise PlanError(
                    f"device {d} is used by stage {seen[d]} and stage {i}", fix="each device runs exactly one stage"
                )
            seen[d] = i
    if cluster is None:
        return
    for i, s in enumerate(plan.stages):
        for d in s.devices:
            if d >= cluster.num_devices:
                raise PlanError(
                    f"stage {i}: device {d} does not exist on cluster {cluster.shape} (devices 0..{cluster.num_devices - 1})",
                    fix="use device indices below the cluster's device count, or a larger --cluster",
                )
        for r in range(s.data_degree):
            nodes = {cluster.node_of(d) for d in s.tensor_group(r)}
            if len(nodes) > 1:
                group = "" if s.data_degree == 1 else f": tensor group {r} {list(s.tensor_group(r))}"
                raise PlanError(
                    f"stage {i} ({s.describe()}){group} spans nodes {sorted(nodes)} of cluster {cluster.shape}",
                    fix=f"a tensor-parallel group must share a node (node = device // {cluster.devices_per_node});"
                    " only the data-parallel replicas of a stage may be on different nodes",
                )
    unused = [d for d in range(cluster.num_devices) if d not in seen]
    if unused:
        raise PlanError(
            f"device(s) {unused} of cluster {cluster.shape} are not used by any stage",
            fix="every device must belong to exactly one stage (on each node the stages' degrees sum to the devices"
            " per node); to use fewer devices, give a smaller --cluster",
        )

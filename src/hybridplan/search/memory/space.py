"""The plan space of CAPTURE (seed 000, section III-C), and its extensions: every plan of a model on a mesh.

A plan cuts the model's ``L`` layers into pipeline stages, in order, and gives each stage a stage config
(:mod:`~hybridplan.search.memory.stage_configs`); every device is used, so the stages' degrees must pack onto
the mesh exactly (:mod:`~hybridplan.search.memory.packing`). :class:`PlanSpace` holds the choices (the mesh,
the optional dimensions of the extended space), checks by arithmetic that a plan exists at all, and builds the
packing state machine on first use; :func:`enumerate_plans` lists the plans and :func:`count_plans` counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

from hybridplan.plan import Cluster
from hybridplan.errors import PlanError
from hybridplan.search.memory.packing import MeshPacking, place_stages
from hybridplan.search.memory.configs import StageChoice, StageConfig, stage_configs
from hybridplan.search.progress import ProgressCallback

__all__ = [
    "PlanSpace",
    "too_few_layers",
    "enumerate_plans",
    "count_plans",
]


@dataclass(frozen=True)
class PlanSpace:
    """All plans of a model of ``num_layers`` layers on a ``num_nodes`` x ``devices_per_node`` mesh.

    Raises:
        PlanError: for non-positive sizes, or when no plan exists at all (fewer layers or a lower
            ``max_stages`` than the stages the mesh needs).
    """

    num_layers: int
    """L: the layers to partition (after any layer merging)."""
    num_nodes: int
    """N: nodes of the mesh."""
    devices_per_node: int
    """k: devices per node; a stage never spans nodes."""
    pipeline_only: bool = False
    """mCAP's space: only degree-1 stages, hence exactly one stage per device."""
    max_stages: int | None = None
    """Upper bound on the pipeline depth; ``None``: no bound beyond the devices and layers."""
    composite: bool = False
    """The extended space: also stages of data x tensor devices (:func:`stage_configs`)."""
    zero: bool = False
    """Also data stages sharded by ZeRO-1, ZeRO-2 and ZeRO-3 (:func:`stage_configs`)."""
    recompute: bool = False
    """Every stage config also with activation recompute (:func:`stage_configs`; the model needs a recompute
    profile to predict them)."""
    cross_node: bool = False
    """Also data (and data x tensor) stages over 2, 4, ... whole nodes ([Note: stages across nodes] in
    search/memory/packing.py); without it a stage never spans nodes (CAPTURE's space)."""
    unsplit_last_stage: bool = False
    """The last stage has no tensor part (the plans an engine runs whose loss on vocabulary shards is not predicted:
    Megatron-LM, runtime/engines.py); :class:`~hybridplan.search.memory.objective.StageTable` holds it."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_nodes", "devices_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"plan space: {name} must be a positive integer, got {value!r}",
                                fix="a model needs at least one layer and a mesh at least 1x1 devices")
        if self.max_stages is not None and (isinstance(self.max_stages, bool) or not isinstance(self.max_stages, int)
                                            or self.max_stages < 1):
            raise PlanError(f"plan space: max_stages must be a positive integer or None, got {self.max_stages!r}")
        # Checked by arithmetic, before anything is built: the packing of a 1000x1000 mesh alone would
        # take hours (issue 9), and a space without plans should fail at once.
        need = self.min_stages
        if self.num_layers < need and self.cross_node and not self.pipeline_only:
            N, k = self.num_nodes, self.devices_per_node
            raise PlanError(f"a {self.mesh} mesh needs at least {need} stages even across nodes (a stage over 2, 4, ..."
                            f" whole nodes each, a node left over filled by powers of two) but the model has"
                            f" {self.num_layers} layers (one stage holds at least one)",
                            fix=f"use fewer devices, e.g. --cluster {1 << (N.bit_length() - 1)}x{k} (one stage over all"
                            " its nodes); or keep more layers when merging (a larger profile --merge-layers L_M)")
        if self.num_layers < need:
            raise too_few_layers(self.num_layers, self.num_nodes, self.devices_per_node, pipeline_only=self.pipeline_only)
        if self.max_stages is not None and self.max_stages < need:
            m, k, per_node = self.max_stages, self.devices_per_node, need // self.num_nodes
            if self.pipeline_only:
                fewer = f"use at most {m} devices"
            elif m >= per_node:
                fewer = f"use at most {_count(m // per_node, 'node')} of {k} devices"
            else:  # nodes of a power-of-two size need one stage each
                fewer = f"use at most {_count(m, 'node')} of {1 << (k.bit_length() - 1)} devices"
            raise PlanError(f"max_stages {self.max_stages} is below the {need} stages a {self.mesh} mesh needs",
                            fix=f"raise max_stages to at least {need}, or {fewer}")

    @classmethod
    def for_cluster(cls, cluster: Cluster, num_layers: int, *, pipeline_only: bool = False,
                    max_stages: int | None = None, composite: bool = False, zero: bool = False,
                    recompute: bool = False, cross_node: bool = False, unsplit_last_stage: bool = False) -> PlanSpace:
        """The space of a :class:`~hybridplan.plan.cluster.Cluster`'s mesh."""
        return cls(num_layers, cluster.num_nodes, cluster.devices_per_node, pipeline_only, max_stages, composite, zero,
                   recompute, cross_node, unsplit_last_stage)

    @property
    def num_devices(self) -> int:
        """N x k."""
        return self.num_nodes * self.devices_per_node

    @property
    def mesh(self) -> str:
        """The mesh as ``NxK``, as ``--cluster`` takes it."""
        return f"{self.num_nodes}x{self.devices_per_node}"

    @property
    def min_stages(self) -> int:
        """The fewest stages of any plan, by arithmetic (the packing need not be built).

        Every device is used and a stage never spans nodes, so each node is filled by stages whose degrees are
        powers of two summing to ``k``; the fewest such powers are the ones bits of ``k`` (two equal powers
        could merge into one stage), e.g. 1 for k = 8, 2 for k = 6 (4 + 2), 6 for k = 1000. Pipeline-only:
        one stage per device. It equals ``packing.to_finish[packing.start]`` (tests/search/memory/test_space.py).
        """
        if self.pipeline_only:
            return self.num_devices
        if self.cross_node:  # the nodes in runs of 2, 4, ... (one stage each), a node left over filled as above
            N = self.num_nodes
            return (N >> 1).bit_count() + (N & 1) * self.devices_per_node.bit_count()
        return self.num_nodes * self.devices_per_node.bit_count()

    @property
    def max_num_stages(self) -> int:
        """The deepest pipeline possible: at most one stage per device, per layer, and ``max_stages``."""
        bound = min(self.num_devices, self.num_layers)
        return bound if self.max_stages is None else min(bound, self.max_stages)

    @cached_property
    def configs(self) -> tuple[StageConfig, ...]:
        """The stage configs, in canonical order."""
        return stage_configs(self.devices_per_node, pipeline_only=self.pipeline_only, composite=self.composite,
                             zero=self.zero, recompute=self.recompute, num_nodes=self.num_nodes,
                             cross_node=self.cross_node)

    @property
    def packing(self) -> MeshPacking:
        """The packing state machine of the mesh, built on first use (see :meth:`mesh_packing`)."""
        return self.mesh_packing()

    def mesh_packing(self, progress: ProgressCallback | None = None) -> MeshPacking:
        """The packing state machine of the mesh, built on first use and kept.

        The solvers call this first, with their ``progress``, because the build can be long where ``k`` is
        not a power of two (:class:`MeshPacking`, bounded here by :attr:`max_num_stages`); for a power-of-two
        ``k`` it takes ``N*k + 1`` states.
        """
        cached = self.__dict__.get("_packing")
        if cached is None:
            k = self.devices_per_node
            # A power-of-two k has N*k + 1 states, numbered by the devices they use: kept whole. Otherwise
            # only the states of plans of at most max_num_stages stages (the model's layers bound it).
            bound = None if k & (k - 1) == 0 else self.max_num_stages
            cached = MeshPacking(self.num_nodes, k, [c.degree for c in self.configs], max_stages=bound,
                                 progress=progress)
            object.__setattr__(self, "_packing", cached)  # a cache, not a field: equality and hash ignore it
        return cached

    def cluster(self) -> Cluster:
        """A uniform cluster of this shape (for :meth:`hybridplan.plan.Plan.validate`)."""
        return Cluster.uniform(self.num_nodes, self.devices_per_node)

    def place(self, choices: Sequence[StageChoice]) -> tuple[tuple[int, ...], ...]:
        """The devices of each stage of a plan (see :func:`place_stages`)."""
        return place_stages([self.configs[c.config].degree for c in choices], self.num_nodes, self.devices_per_node)


def too_few_layers(num_layers: int, num_nodes: int, devices_per_node: int, *, pipeline_only: bool = False) -> PlanError:
    """The error for a mesh that needs more stages than the model has layers, suggesting *smaller* meshes.

    Each suggestion is a mesh whose space has plans: fewer nodes of the same ``k``; for a ``k`` that is not a
    power of two, nodes of the largest power of two below it (one stage per node); pipeline-only, at most one
    device per layer. Keeping more layers when merging (a larger ``profile --merge-layers``) is the other way out.

    >>> print(too_few_layers(10, 1000, 1000))  # doctest: +NORMALIZE_WHITESPACE
    a 1000x1000 mesh needs at least 6000 stages (6 per node: a stage never spans nodes and its degree is a
    power of two) but the model has 10 layers (one stage holds at least one)
      fix: use fewer devices: at most 1 node of 1000, e.g. --cluster 1x1000, or --cluster 10x512 (a node of
      2^j devices needs one stage); or keep more layers when merging (a larger profile --merge-layers L_M)
    """
    N, k, L = num_nodes, devices_per_node, num_layers
    mesh = f"{N}x{k}"
    if pipeline_only:
        need, how = N * k, "one per device, pipeline-only"
        nodes, per_node = (L // k, k) if L >= k else (1, L)
        options = [f"at most {L} devices, e.g. --cluster {nodes}x{per_node}",
                   "or allow data/tensor-parallel stages (no --pipeline-only)"]
    else:
        per = k.bit_count()
        need = N * per
        how = ("one per node: a stage never spans nodes" if per == 1 else
               f"{per} per node: a stage never spans nodes and its degree is a power of two")
        options = []
        if L >= per:
            options.append(f"at most {_count(L // per, 'node')} of {k}, e.g. --cluster {L // per}x{k}")
        if per > 1:
            pow2 = 1 << (k.bit_length() - 1)
            options.append(f"{'or ' if options else ''}--cluster {min(N, L)}x{pow2} (a node of 2^j devices needs one stage)")
    return PlanError(
        f"a {mesh} mesh needs at least {need} stages ({how}) but the model has {L} layers (one stage holds at least one)",
        fix="use fewer devices: " + ", ".join(options)
        + "; or keep more layers when merging (a larger profile --merge-layers L_M)",
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def enumerate_plans(space: PlanSpace,
                    keep: Callable[[StageChoice, int], bool] | None = None) -> Iterator[tuple[StageChoice, ...]]:
    """Every plan of the space, once each, as stage choices in pipeline order.

    Plans are built from the last stage to the first, so that when a stage is chosen the number of
    stages after it is known: ``keep(choice, stages_after)``, if given, can then cut every plan that
    contains the stage (CAPTURE's pruning, :mod:`~hybridplan.search.memory.exhaustive`). Partial plans that can
    no longer be completed (too few layers left for the stages the remaining devices need) are cut
    early; that removes no complete plan.
    """
    pk = space.packing
    cols = [pk.column(c.degree) for c in space.configs]
    limit = space.max_num_stages

    def walk(stop: int, state: int, suffix: list[StageChoice]) -> Iterator[tuple[StageChoice, ...]]:
        for start in range(stop - 1, -1, -1):
            for ci, col in enumerate(cols):
                nxt = int(pk.next[state, col])
                if nxt < 0:
                    continue
                choice = StageChoice(start, stop, ci)
                if keep is not None and not keep(choice, len(suffix)):
                    continue
                suffix.append(choice)
                if start == 0:
                    if pk.accepting[nxt]:
                        yield tuple(reversed(suffix))
                else:
                    need = int(pk.to_finish[nxt])
                    if 1 <= need <= start and len(suffix) + need <= limit:
                        yield from walk(start, nxt, suffix)
                suffix.pop()

    yield from walk(space.num_layers, pk.start, [])


def count_plans(space: PlanSpace) -> int:
    """The number of plans in the space, by dynamic programming (no enumeration).

    ``ways[s][r][n]`` counts the ways to cover layers ``[s, L)`` with ``n`` stages whose degrees form
    packing state ``r``. Pipeline-only on ``G`` devices gives ``C(L-1, G-1)`` (mCAP's ``P_all``).
    """
    pk = space.packing
    cols = [pk.column(c.degree) for c in space.configs]
    L, limit = space.num_layers, space.max_num_stages
    ways: list[dict[tuple[int, int], int]] = [dict() for _ in range(L + 1)]
    ways[L][(pk.start, 0)] = 1
    for start in range(L - 1, -1, -1):
        acc = ways[start]
        for stop in range(start + 1, L + 1):
            for (state, n), w in ways[stop].items():
                if n + 1 > limit:
                    continue
                for col in cols:
                    nxt = int(pk.next[state, col])
                    if nxt >= 0:
                        acc[(nxt, n + 1)] = acc.get((nxt, n + 1), 0) + w
    return sum(w for (state, _), w in ways[0].items() if pk.accepting[state])

"""The stage configs of CAPTURE's plan space (seed 000, section III-C) and the extended space's.

A plan cuts the model's ``L`` layers into pipeline stages, in order, and gives each stage a *stage
config*: pipeline-only (``"none"``, degree 1) or data-/tensor-parallel at a power-of-two degree up to
the devices per node ``k`` (2, 4, ..., the powers of two ``<= k``). For ``k = 2^d`` that is ``2*d + 1``
configs, e.g. none, data x2, data x4, tensor x2, tensor x4 for ``k = 4``. (The paper writes
``2*log2(k) - 1``: ``2*d`` kind-and-degree pairs less the 1-way duplicate; but its degrees 1..k are
``d + 1`` per kind, which gives ``2*(d+1) - 1``.) Every device is used, a stage never spans nodes, so on
each node the stages' degrees sum to ``k``.

The extended space adds data x tensor stages, ZeRO-sharded data stages, stages over whole nodes ([Note: stages
across nodes] in :mod:`~hybridplan.search.memory.packing`) and per-stage recompute (:func:`stage_configs`). A
:class:`StageChoice` is one stage of a plan before placement: its layers and the index of its config.
"""

from __future__ import annotations

from typing import NamedTuple

from hybridplan.plan import Parallelism

__all__ = ["KINDS", "StageConfig", "StageChoice", "stage_configs"]

KINDS: tuple[str, ...] = ("none", "data", "tensor", "data+tensor")
"""Stage kinds in canonical order (the rank breaks exact ties between plans, see objective.py)."""


class StageConfig(NamedTuple):
    """How one stage runs: ``kind`` ("none", "data", "tensor", "data+tensor") at ``degree`` devices; a
    "data+tensor" stage is ``degree / tensor_degree`` replicas of ``tensor_degree`` devices (0 otherwise)."""

    kind: Parallelism
    degree: int
    tensor_degree: int = 0
    zero: int = 0
    """ZeRO level of a "data" or "data+tensor" stage (0: unsharded; predict/zero_layout.py)."""
    recompute: bool = False
    """Every layer of the stage recomputes its activations (predicted from a recompute profile:
    [Note: recompute chosen per stage] in predict/memory.py)."""

    @property
    def model_kwargs(self) -> dict[str, int]:
        """What a stage-memory model is told beyond ``(kind, degree)``: the tensor degree of a data x tensor
        stage, the ZeRO level of a sharded one, ``recompute`` of a recomputed one (the protocol in
        search/memory/objective.py), nothing else."""
        more = {"tensor_degree": self.tensor_degree} if self.kind == "data+tensor" else {}
        if self.zero:
            more["zero"] = self.zero
        if self.recompute:
            more["recompute"] = True
        return more

    @property
    def label(self) -> str:
        """E.g. ``none x1``, ``tensor x4``, ``data x2 + tensor x2``, ``data x2 ZeRO-1``, ``none x1 recompute``."""
        if self.kind == "data+tensor":
            out = f"data x{self.degree // self.tensor_degree} + tensor x{self.tensor_degree}" + (
                f" ZeRO-{self.zero}" if self.zero else "")
        else:
            out = f"{self.kind} x{self.degree}" + (f" ZeRO-{self.zero}" if self.zero else "")
        return out + (" recompute" if self.recompute else "")


class StageChoice(NamedTuple):
    """One stage of a plan before placement: layers ``[start, stop)`` with ``space.configs[config]``."""

    start: int
    stop: int
    config: int


def stage_configs(devices_per_node: int, *, pipeline_only: bool = False, composite: bool = False, zero: bool = False,
                  recompute: bool = False, num_nodes: int = 1, cross_node: bool = False) -> tuple[StageConfig, ...]:
    """The stage configs of a node of ``devices_per_node`` devices, in canonical order.

    The order is by kind (none < data < tensor < data+tensor), then degree, then tensor degree, so that
    comparing config indices is comparing ``(kind, degree, tensor degree)``: the exact solver relies on it to
    visit candidates in canonical order. ``composite`` adds the data x tensor stages (both degrees at least 2,
    powers of two, together at most a node): the extended space; without it the space is CAPTURE's. ``zero``
    adds the data stages sharded by ZeRO-1 and ZeRO-3 after those, then ZeRO-2, and with ``composite`` the data x
    tensor stages sharded by ZeRO-3, ZeRO-2 and ZeRO-1 last (predict/zero_layout.py; added later, so the indices of the others, and the plans
    drawn from them, stay as they were). ``cross_node`` adds, after those, the stages over ``m`` whole nodes of a mesh of ``num_nodes``
    (``m`` = 2, 4, ... up to the nodes): data x ``m*k``, with ``composite`` data x tensor at ``m*k`` devices (tensor
    degree a power of two dividing ``k``: a tensor group stays in its node), with ``zero`` their ZeRO forms
    ([Note: stages across nodes] in packing.py). ``recompute`` then repeats every config so far with activation
    recompute, last: each stage of a plan may recompute or not, and the indices of the configs without it stay
    as they were.

    >>> [f"{c.kind}{c.degree}" for c in stage_configs(4)]
    ['none1', 'data2', 'data4', 'tensor2', 'tensor4']
    >>> [c.label for c in stage_configs(8, composite=True)][-3:]
    ['data x2 + tensor x2', 'data x4 + tensor x2', 'data x2 + tensor x4']
    >>> [c.label for c in stage_configs(2, recompute=True)]
    ['none x1', 'data x2', 'tensor x2', 'none x1 recompute', 'data x2 recompute', 'tensor x2 recompute']
    """
    degrees = [2**a for a in range(1, devices_per_node.bit_length()) if 2**a <= devices_per_node]
    both = tuple(StageConfig("data+tensor", d * t, t) for d in degrees for t in degrees if d * t <= devices_per_node)
    k = devices_per_node
    spans = [m * k for m in (2**a for a in range(1, num_nodes.bit_length())) if m <= num_nodes] if cross_node else []
    plain = (StageConfig("none", 1),) if pipeline_only else (
        (StageConfig("none", 1),)
        + tuple(StageConfig("data", d) for d in degrees)
        + tuple(StageConfig("tensor", d) for d in degrees)
        + (tuple(sorted(both, key=lambda c: (c.degree, c.tensor_degree))) if composite else ())
        + (tuple(StageConfig("data", d, 0, z) for z in (1, 3) for d in degrees) if zero else ())
        + tuple(StageConfig("data", d) for d in spans)
        + (tuple(StageConfig("data+tensor", d, t) for d in spans for t in degrees if k % t == 0) if composite else ())
        + (tuple(StageConfig("data", d, 0, z) for z in (1, 3) for d in spans) if zero else ())
        + (tuple(StageConfig("data", d, 0, 2) for d in degrees + spans) if zero else ())  # last: older draws stay
        + (tuple(c._replace(zero=z) for z in (3, 2, 1) for c in sorted(both, key=lambda c: (c.degree, c.tensor_degree)))
           + tuple(StageConfig("data+tensor", d, t, z) for z in (3, 2, 1) for d in spans for t in degrees if k % t == 0)
           if zero and composite else ())  # ZeRO-3, ZeRO-2 and ZeRO-1 of data x tensor stages, later still
    )
    return plain + (tuple(c._replace(recompute=True) for c in plain) if recompute else ())

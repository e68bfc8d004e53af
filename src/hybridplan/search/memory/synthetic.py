"""Stand-in stage-memory models for tests and benchmarks, until the predictor provides real ones.

Nothing here is measured: the numbers only give the solvers realistic shapes (an additive CAPTURE-style
model) or adversarial ones (random integer tables full of ties).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from hybridplan.search.memory.configs import stage_configs

__all__ = ["AdditiveStageModel", "TableStageModel", "RECOMPUTE_KEPT"]

RECOMPUTE_KEPT = 0.25
"""Stand-in only (not measured): the part of a stage's activations a recomputed micro-batch keeps in flight."""


@dataclass(frozen=True, eq=False)
class AdditiveStageModel:
    """CAPTURE's additive prediction (seed 000, III-B) with a pipeline in-flight term and kind scaling.

    A pipeline-only stage ``[start, stop)`` with one micro-batch in flight takes
    ``M_i(start) + sum(M_a(start+1 .. stop-1))``; each extra micro-batch in flight adds the stage's
    activations ``A``. In flight: ``min(stages_after+1, H)`` (1F1B with ``H`` micro-batches; H = 1 is GPipe).
    Data parallelism at degree ``d`` splits the activations, tensor parallelism splits everything
    (a deliberately simple stand-in for CAPTURE's fitted logarithmic curves); ZeRO splits the rest of a data
    stage as fp32 AdamW's thirds would be (1: two of three, the optimizer state; 3: all). A recomputed stage
    keeps, per extra micro-batch in flight, only :data:`RECOMPUTE_KEPT` of its activations (the layer inputs;
    one micro-batch's full activations still live while it recomputes), an arbitrary stand-in fraction.
    """

    isolated: tuple[float, ...]
    """M_i per layer: peak with the layer alone on a device."""
    added: tuple[float, ...]
    """M_a per layer: increase when the layer joins the layers before it."""
    activation: tuple[float, ...]
    """Activation bytes per micro-batch kept for the backward pass, per layer (part of M_i/M_a)."""
    position_horizon: int = 1
    """H: in-flight micro-batches are ``min(stages_after+1, H)``."""
    tensor_ok: tuple[bool, ...] | None = None
    """Per layer, whether it can be tensor-parallel (``None``: all can)."""
    microbatch_size: int | None = None
    """A data-parallel degree must divide it (``None``: no constraint)."""

    @classmethod
    def transformer(cls, num_layers: int, *, horizon: int = 1, seed: int = 0, jitter: float = 0.05,
                    microbatch_size: int | None = None) -> AdditiveStageModel:
        """A GPT-like model: a heavy embedding, ``num_layers-2`` similar blocks, a heavy head.

        The blocks vary by up to ``jitter`` (relative); with ``jitter=0`` they are identical, so many plans
        tie exactly. The last layer (the loss head) cannot be tensor-parallel, to exercise ``allowed``.
        """
        rng = np.random.default_rng(seed)
        block = 100.0 * (1.0 + rng.uniform(-jitter, jitter, num_layers))
        act = 30.0 * (1.0 + rng.uniform(-jitter, jitter, num_layers))
        block[0], act[0] = 400.0, 10.0
        block[-1], act[-1] = 500.0, 60.0
        iso = block + 20.0  # a fixed per-device buffer shows up in M_i only
        tensor_ok = tuple(i != num_layers - 1 for i in range(num_layers))
        return cls(tuple(iso.tolist()), tuple(block.tolist()), tuple(act.tolist()), horizon, tensor_ok, microbatch_size)

    @cached_property
    def _prefix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        iso = np.asarray(self.isolated, dtype=np.float64)
        added = np.concatenate([[0.0], np.cumsum(self.added, dtype=np.float64)])
        act = np.concatenate([[0.0], np.cumsum(self.activation, dtype=np.float64)])
        ok = np.ones(len(iso), dtype=bool) if self.tensor_ok is None else np.asarray(self.tensor_ok, dtype=bool)
        not_ok = np.concatenate([[0], np.cumsum(~ok)])
        return iso, added, act, not_ok

    def allowed(self, start: int, stop: int, kind: str, degree: int, *, tensor_degree: int = 0, zero: int = 0,
                recompute: bool = False) -> bool:
        """Tensor stages need every layer tensor-capable; data degrees must divide the micro-batch size."""
        data = degree // tensor_degree if kind == "data+tensor" else degree if kind == "data" else 1
        if kind in ("tensor", "data+tensor"):
            not_ok = self._prefix[3]
            if not_ok[stop] != not_ok[start]:
                return False
        if data > 1 and self.microbatch_size is not None:
            return self.microbatch_size % data == 0
        return True

    def stage_memory(self, start: int, stop: int, kind: str, degree: int, stages_after: int, *,
                     tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> float:
        """See the class docstring; the same arithmetic as :meth:`stage_memory_matrix`, bit for bit."""
        iso, added, act, _ = self._prefix
        base = iso[start] + (added[stop] - added[start + 1])
        a = act[stop] - act[start]
        return float(self._combine(base, a, kind, degree, stages_after, tensor_degree, zero, recompute))

    def stage_memory_matrix(self, kind: str, degree: int, stages_after: int, num_layers: int, *,
                            tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> np.ndarray:
        """All ``[start, stop]`` values at once (``inf`` where not allowed), for :class:`StageTable`."""
        iso, added, act, not_ok = self._prefix
        base = iso[:, None] + (added[None, :] - added[1:, None])
        a = act[None, :] - act[:-1, None]
        out = self._combine(base, a, kind, degree, stages_after, tensor_degree, zero, recompute)
        if kind in ("tensor", "data+tensor"):
            out = np.where(not_ok[None, :] == not_ok[:-1, None], out, np.inf)
        data = degree // tensor_degree if kind == "data+tensor" else degree if kind == "data" else 1
        if data > 1 and self.microbatch_size is not None and self.microbatch_size % data:
            out = np.full_like(out, np.inf)
        return out

    def _combine(self, base: np.ndarray, a: np.ndarray, kind: str, degree: int, stages_after: int,
                 tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> np.ndarray:
        extra = (min(stages_after + 1, self.position_horizon) - 1) * (RECOMPUTE_KEPT if recompute else 1.0)
        if kind == "none":
            return base + a * extra
        if kind == "data":
            return (base - a) * _kept(zero, degree) + a * (1 + extra) / degree
        if kind == "data+tensor":  # tensor splits everything, the replicas split the activations (and ZeRO the rest)
            data = degree // tensor_degree
            return ((base - a) * _kept(zero, data) + a * (1 + extra) / data) / tensor_degree
        return (base + a * extra) / degree


@dataclass(frozen=True, eq=False)
class TableStageModel:
    """A stage model given by explicit tables: ``values[(kind, degree)][position, start, stop]``.

    Built with :meth:`random` it draws small integers, so many plans tie exactly: the adversarial case
    for the tie-break.
    """

    values: dict[tuple[str, int, int], np.ndarray]
    """Per config ``(kind, degree, tensor degree)``, an ``(H, L, L+1)`` array; ``position = min(stages_after, H-1)``."""
    disallowed: dict[tuple[str, int, int], np.ndarray] = field(default_factory=dict)
    """Per config, an ``(L, L+1)`` boolean array of disallowed stages (missing: all allowed)."""

    @property
    def position_horizon(self) -> int:
        """H, the first dimension of the tables."""
        return next(iter(self.values.values())).shape[0]

    @classmethod
    def random(cls, num_layers: int, devices_per_node: int, *, horizon: int, seed: int, levels: int = 3,
               p_disallowed: float = 0.0, composite: bool = False, zero: bool = False,
               recompute: bool = False, num_nodes: int = 1, cross_node: bool = False) -> TableStageModel:
        """Integer values in ``[0, levels)`` for every config of a node of ``devices_per_node`` devices (and the
        data x tensor configs with ``composite``, the ZeRO ones with ``zero``, the recomputed ones with
        ``recompute``, those over ``num_nodes`` whole nodes with ``cross_node``: drawn after the others, so
        CAPTURE's tables stay the same)."""
        rng = np.random.default_rng(seed)
        L = num_layers
        values, disallowed = {}, {}
        for cfg in stage_configs(devices_per_node, composite=composite, zero=zero, recompute=recompute,
                                 num_nodes=num_nodes, cross_node=cross_node):
            values[cfg] = rng.integers(0, levels, size=(horizon, L, L + 1)).astype(np.float64)
            if p_disallowed > 0 and cfg.kind != "none":
                disallowed[cfg] = rng.random((L, L + 1)) < p_disallowed
        return cls({_key(k.kind, k.degree, k.tensor_degree, k.zero, k.recompute): v for k, v in values.items()},
                   {_key(k.kind, k.degree, k.tensor_degree, k.zero, k.recompute): v for k, v in disallowed.items()})

    def allowed(self, start: int, stop: int, kind: str, degree: int, *, tensor_degree: int = 0, zero: int = 0,
                recompute: bool = False) -> bool:
        """False where the ``disallowed`` table says so."""
        mask = self.disallowed.get(_key(kind, degree, tensor_degree, zero, recompute))
        return mask is None or not bool(mask[start, stop])

    def stage_memory(self, start: int, stop: int, kind: str, degree: int, stages_after: int, *,
                     tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> float:
        """A table look-up at ``min(stages_after, H-1)``."""
        table = self.values[_key(kind, degree, tensor_degree, zero, recompute)]
        return float(table[min(stages_after, table.shape[0] - 1), start, stop])


def _key(kind: str, degree: int, tensor_degree: int, zero: int, recompute: bool) -> tuple[str, int, int]:
    """A :class:`TableStageModel` key: ZeRO and recompute ride on the kind (``data-zero1``, ``none-recompute``)."""
    return kind + (f"-zero{zero}" if zero else "") + ("-recompute" if recompute else ""), degree, tensor_degree


def _kept(zero: int, replicas: int) -> float:
    """The share of the non-activation bytes a device keeps at ZeRO ``zero`` over ``replicas`` (synthetic: ZeRO-1
    shards two thirds of them, the optimizer state; ZeRO-2/3 all)."""
    return {0: 1.0, 1: (1 + 2 / replicas) / 3, 3: 1 / replicas}.get(zero, 1.0)

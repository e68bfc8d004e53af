"""Per-layer memory statistics M_i and M_a (CAPTURE seed 000 III-A), for every quantity.

For a scenario (pipeline-only, or data/tensor-parallel at a degree) and a profiled batch size:

- ``M_i(l)``: the quantities of layer ``l`` alone on a stage;
- ``M_a(l) = Q(n..l) - Q(n..l-1)``: what adding layer ``l`` to its neighbours ``n..l-1`` adds, with
  ``n`` the anchor the campaign profiled (profiling/partitions.py), else the nearest one measured.

A stage ``[a, b)`` then has ``Q(a..b-1) = M_i(a) + sum M_a(a+1..b-1)`` (the predictor of seed 000,
applied to each quantity); a span that was measured directly is used as measured. The same is kept for
the stage *peak* as measured in the profiling runs (``peak`` below): that is CAPTURE's original
statistic, position-dependent under 1F1B, kept to compare against. In a profile taken with recompute, a
composed span's four transients are instead the layer-max rule over its layers' ``M_i``
(profiling/recomputed_spans.py, [Note: the transients of a recomputed stage]).

[Note: workspaces are per device] On CUDA the cuBLAS/cuBLASLt workspaces (runtime/gpu_memory.py [Note:
cuBLAS workspaces]) are held once per device and thread from the first matmul that needs them, so a measured
span's ``static`` holds those its layers' matmuls allocated, whichever layer ran them first. Composed as if
they were per-layer bytes, a stage would get them not at all (it starts with a layer without matmuls and its
other layers' ``M_a`` come from chains that had already allocated them) or twice (it starts with a matmul and
holds a layer whose chain ran none before it). So where every measurement of a scenario and batch size
records its workspaces (a simulated CUDA device: table ``workspaces`` of profiling/store.py), they are taken
out of ``static`` and of the measured ``peak`` before ``M_i``/``M_a`` are formed, each layer keeps the
workspaces its own span ``[l, l+1)`` held (else, when that span was not measured, those of the span its
``M_a`` came from: a superset), and a composed stage gets back the union of its layers' workspaces (keyed
by library and thread, so a workspace two layers need counts once). A span measured directly is still
used as measured. Where any measurement does not record them (a CPU, which has none; a real CUDA device,
whose allocator counters do not tell them apart; a database written before the table), nothing is taken
out: the composition is the one above, exact when the workspaces are none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.quantities import QUANTITIES
from hybridplan.profiling.recomputed_spans import RECOMPUTED_TRANSIENTS, layer_max_table
from hybridplan.profiling.store import Measurement, ProfileStore

__all__ = ["SpanStatistics", "build_statistics", "STATISTIC_QUANTITIES", "statistics_of", "load_statistics", "anchor_of"]

STATISTIC_QUANTITIES: tuple[str, ...] = QUANTITIES + ("peak",)
"""Columns of the statistics: the eight quantities, then CAPTURE's measured peak."""

_HELD_IN = [STATISTIC_QUANTITIES.index("static"), STATISTIC_QUANTITIES.index("peak")]
"""The columns that hold a device's workspaces: held from before an iteration starts, so at its peak too."""

_LATER = STATISTIC_QUANTITIES.index("backward_transient")


@dataclass
class SpanStatistics:
    """Statistics of one scenario at one profiled batch size.

    ``mi[l]`` and ``ma[l]`` are vectors over :data:`STATISTIC_QUANTITIES` (NaN where unmeasured).
    """

    num_layers: int
    microbatch_size: int
    batch_size: int
    spans: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    mi: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    ma: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    inconsistency: float = 0.0
    """Largest difference between two measurements of the same span (bytes); 0 on a deterministic runtime."""
    bounds: list[int] | None = None
    """For merged layers (profiling/merger.py): unit ``i`` is original layers ``[bounds[i], bounds[i+1])``;
    None when units are the original layers."""
    workspaces: list[dict[str, int]] | None = None
    """Per unit, the library workspaces its layers hold (``{"cublas/forward": bytes, ...}``), taken out of
    ``mi``/``ma`` and added back per composed span ([Note: workspaces are per device]); None when the
    measurements did not record them (nothing was taken out)."""
    recompute: bool = False
    """Whether the stages were profiled recomputed: a composed span's transients are then the layer-max rule over
    its layers alone ([Note: the transients of a recomputed stage]), not sums of ``M_a``."""
    sharded: bool = False
    """Whether the stages were FSDP units (a ZeRO-3 scenario): a composed span's transients are then at least what
    its measured parts imply ([Note: a composed span holds at least its measured parts])."""
    following: dict[tuple[int, int], float] = field(default_factory=dict)
    """A ZeRO-3 scenario's measured spans' later-backward transient after a backward, where their runs had one
    (profiling/execution.py [Note: a ZeRO-3 stage's steady backward]); ``spans`` hold the largest, after a forward."""

    def __post_init__(self) -> None:
        if self.mi.size == 0:
            shape = (self.num_layers, len(STATISTIC_QUANTITIES))
            self.mi = np.full(shape, np.nan)
            self.ma = np.full(shape, np.nan)
        self._prefix: tuple[np.ndarray, np.ndarray] | None = None
        self._tables: dict[bool, np.ndarray] = {}
        self._ruled_spans: np.ndarray | None = None

    def _ruled(self) -> np.ndarray:
        """The layer-max transients of every span (``[L, L+1, 4]``; [Note: the transients of a recomputed stage])."""
        if self._ruled_spans is None:
            self._ruled_spans = layer_max_table(self.mi)
        return self._ruled_spans

    def _ma_prefix(self) -> tuple[np.ndarray, np.ndarray]:
        """Prefix sums of M_a (missing values as 0) and of the number of missing M_a rows."""
        if self._prefix is None:
            missing = np.isnan(self.ma).any(axis=1)
            missing[0] = False
            ma = np.where(np.isnan(self.ma), 0.0, self.ma)
            ma[0] = 0.0
            zero = np.zeros((1, ma.shape[1]))
            self._prefix = (np.vstack([zero, np.cumsum(ma, axis=0)]), np.concatenate([[0], np.cumsum(missing)]))
        return self._prefix

    def span(self, start: int, stop: int) -> np.ndarray | None:
        """Statistic vector of the stage ``[start, stop)``: measured, else composed, else None."""
        measured = self.spans.get((start, stop))
        if measured is not None:
            return measured
        sums, missing = self._ma_prefix()
        if missing[stop] - missing[start + 1] > 0 or np.isnan(self.mi[start]).any():
            return None
        return self.all_spans()[start, stop].copy()  # composed, at least its measured parts ([Note: ...])

    @staticmethod
    def _recomputed(composed: np.ndarray, ruled: np.ndarray) -> None:
        """Put the layer-max transients ``ruled`` (``[..., 4]``) into ``composed`` where every layer was measured alone
        (elsewhere the chain composition stays: the best the profile can say)."""
        view = composed[..., RECOMPUTED_TRANSIENTS]
        composed[..., RECOMPUTED_TRANSIENTS] = np.where(np.isnan(ruled), view, ruled)

    def _held(self, start: int, stop: int) -> np.ndarray:
        """The workspaces the composed span ``[start, stop)`` holds, as a statistic vector (in ``static`` and ``peak``)."""
        held = np.zeros(len(STATISTIC_QUANTITIES))
        if self.workspaces is not None:
            union: dict[str, int] = {}
            for layer in self.workspaces[start:stop]:
                union.update(layer)
            held[_HELD_IN] = sum(union.values())
        return held

    def all_spans(self, *, after_backward: bool = False) -> np.ndarray:
        """``[L, L+1, Q]`` array of every span's statistics (NaN where unknown), measured spans as measured; made
        once (read-only): every predictor retargeted to another batch scales the same statistics again, and a
        throughput search of Llama-3-70B on 32x8 asked 4,647 times. ``after_backward``: with the later backward of
        :attr:`following` where measured, and composed spans floored by those ([Note: a ZeRO-3 stage's steady
        backward] in profiling/execution.py); the same table where nothing was."""
        after_backward = after_backward and bool(self.following)
        if after_backward not in self._tables:
            table = self._all_spans(self._after_backward() if after_backward else self.spans)
            table.setflags(write=False)
            self._tables[after_backward] = table
        return self._tables[after_backward]

    def _after_backward(self) -> dict[tuple[int, int], np.ndarray]:
        """The measured spans with their later backward after a backward where known."""
        out = dict(self.spans)
        for key, transient in self.following.items():
            out[key] = out[key].copy()
            out[key][_LATER] = transient
        return out

    def _all_spans(self, measured: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
        L, Q = self.num_layers, len(STATISTIC_QUANTITIES)
        sums, missing = self._ma_prefix()
        out = self.mi[:, None, :] + (sums[None, :, :] - sums[1 : L + 1, None, :])
        unknown = (missing[None, :] - missing[1 : L + 1, None]) > 0
        if self.workspaces is not None:
            for a in range(L):
                union: dict[str, int] = {}
                for b in range(a + 1, L + 1):
                    union.update(self.workspaces[b - 1])
                    out[a, b, _HELD_IN] += sum(union.values())
        if self.recompute:
            self._recomputed(out, self._ruled())
        out[unknown] = np.nan
        if self.sharded:
            _at_least_measured_parts(out, measured)
        starts, stops = np.triu_indices(L + 1, 1)
        mask = np.zeros((L, L + 1), dtype=bool)
        mask[starts[starts < L], stops[starts < L]] = True
        out[~mask] = np.nan
        for (a, b), v in measured.items():
            out[a, b] = v
        return out.reshape(L, L + 1, Q)

    def rows(self) -> list[tuple[int, str, str, float]]:
        """``(layer, "M_i"|"M_a", quantity, value)`` rows for the database."""
        out = []
        for layer in range(self.num_layers):
            for name, table in (("M_i", self.mi), ("M_a", self.ma)):
                for q, value in zip(STATISTIC_QUANTITIES, table[layer]):
                    if np.isfinite(value) and not (name == "M_a" and layer == 0):
                        out.append((layer, name, q, float(value)))
        return out


def _at_least_measured_parts(out: np.ndarray, spans: dict[tuple[int, int], np.ndarray]) -> None:
    """Raise each composed span's forward and later backward transients of ``out`` (``[L, L+1, Q]``, in place) to what
    its measured parts imply (a ZeRO-3 scenario's; [Note: a composed span holds at least its measured parts]).

    [Note: a composed span holds at least its measured parts] A stage ``[a, c)`` runs the forward of any part
    ``[x, y)`` of it with the activations of ``[a, x)`` already held, and a later backward of that part once the
    activations of ``[y, c)`` are freed: so its forward transient is at least ``A(a, x) + F(x, y)`` and its later
    backward's at least ``B(x, y) - A(y, c)``, for every part measured as a stage of its own. In a ZeRO-3 scenario
    ``M_i``/``M_a`` sums (and, recomputed, the layer-max rule over layers measured alone) need not be: a ZeRO-3
    backward holds the previous layer prefetched while a layer runs, which a two-layer span measures and a layer alone
    does not. Mixtral-8x7B's two blocks and head as data x4 ZeRO-3 recomputed (bf16, 2 rows of 2,048 tokens a
    replica): the later backward composed 5,987,302,912 bytes, the blocks' measured span 9,447,686,144 (one block's
    6,545,145,856 and the other's 2,902,540,288 gathered bytes), the head's activations 557,842,944: at least
    8,889,843,200; the simulated device holds 9,151,995,904 (the head's reduce-scatter input too, which
    predict/zero_stage.py adds), 12.9% above the composed device before. The first backward is left as composed: a
    part measured at its own position may follow several forwards and hold FSDP2's spurious prefetch ([Note: a first
    backward after several forwards] in predict/zero3_transients.py), which the stage need not (on that Mixtral stage
    it made the device 5.4% high). The part's later backward is its largest, after a forward where its run had one,
    while ``M_i``/``M_a`` are formed from its later backward after a backward ([Note: a ZeRO-3 stage's steady
    backward] in profiling/execution.py). Not applied to other scenarios: there the sums hold, and a part measured as a stage
    carries its boundary's costs (tiny models' data x tensor stages were 432-1,024 bytes high with it). Activations
    are the composed spans' own. NaN stays NaN; measured spans are not changed."""
    act = STATISTIC_QUANTITIES.index("activation")
    fwd, later = STATISTIC_QUANTITIES.index("forward_transient"), STATISTIC_QUANTITIES.index("backward_transient")
    L = out.shape[0]
    with np.errstate(invalid="ignore"):
        for (x, y), v in spans.items():
            before = np.zeros(x + 1)  # A(a, x) for a = 0..x (a = x: nothing before the part)
            before[:x] = out[:x, x, act]
            after = np.zeros(L + 1 - y)  # A(y, c) for c = y..L (c = y: nothing after it)
            after[1:] = out[y, y + 1:, act] if y < L else []
            block = out[:x + 1, y:]  # the spans [a, c) holding the part: a <= x, c >= y
            for q, floor in ((fwd, (before + v[fwd])[:, None]), (later, (v[later] - after)[None, :])):
                if not np.isnan(v[q]):  # NaN (unknown) entries stay NaN: fmax would make them known
                    block[..., q] = np.where(np.isnan(block[..., q]), block[..., q], np.fmax(block[..., q], floor))


def build_statistics(
    measurements: Sequence[Measurement],
    *,
    num_layers: int,
    anchor: Callable[[int], int] | None = None,
    bounds: Sequence[int] | None = None,
    recompute: bool = False,
    sharded: bool = False,
) -> SpanStatistics:
    """Statistics from the measurements of ONE scenario at ONE batch size.

    Args:
        measurements: the device measurements (all devices of a stage report the same span).
        num_layers: L (the number of units when ``bounds`` is given).
        anchor: the profiled neighbour anchor of each layer (``n`` for ``M_a(l)``); when its pair is
            missing, the nearest measured pair (largest ``n < l``) is used.
        bounds: merged units' original boundaries; measurements not on them are ignored.
        recompute: the stages were profiled recomputed ([Note: the transients of a recomputed stage]).
        sharded: the stages were FSDP units ([Note: a composed span holds at least its measured parts]).
    """
    if not measurements:
        raise ValueError("no measurements")
    unit = {b: i for i, b in enumerate(bounds)} if bounds is not None else None
    spans: dict[tuple[int, int], np.ndarray] = {}
    held: dict[tuple[int, int], dict[str, int]] = {}
    following: dict[tuple[int, int], int] = {}
    separate = all(m.workspaces is not None for m in measurements)  # [Note: workspaces are per device]
    worst = 0.0
    for m in measurements:
        vector = np.append(m.quantities, m.peak)
        key = (m.start, m.stop)
        if unit is not None:
            if m.start not in unit or m.stop not in unit:
                continue
            key = (unit[m.start], unit[m.stop])
        if key in spans:
            # Quantities are position-free and must agree; peaks legitimately differ with the position.
            worst = max(worst, float(np.max(np.abs(spans[key][:-1] - vector[:-1]))))
            continue
        spans[key] = vector
        if separate:
            held[key] = dict(m.workspaces or {})
        if sharded and m.backward_after_backward is not None:
            following[key] = m.backward_after_backward
    bare = {key: v - _vector_of(held[key]) for key, v in spans.items()} if separate else dict(spans)
    for key, transient in following.items():  # [Note: a ZeRO-3 stage's steady backward] in profiling/execution.py
        bare[key] = bare[key].copy()
        bare[key][_LATER] = transient
    stats = SpanStatistics(
        num_layers=num_layers,
        microbatch_size=measurements[0].microbatch_size,
        batch_size=measurements[0].batch_size,
        spans=spans,
        inconsistency=worst,
        bounds=list(bounds) if bounds is not None else None,
        recompute=recompute,
        sharded=sharded,
        following={key: float(transient) for key, transient in following.items()},
    )
    if separate:
        stats.workspaces = [held.get((layer, layer + 1), {}) for layer in range(num_layers)]
    for layer in range(num_layers):
        single = bare.get((layer, layer + 1))
        if single is not None:
            stats.mi[layer] = single
        if layer == 0:
            continue
        candidates = sorted((n for n in range(layer) if (n, layer) in spans and (n, layer + 1) in spans), reverse=True)
        preferred = anchor(layer) if anchor is not None else None
        if preferred in candidates:
            candidates.remove(preferred)
            candidates.insert(0, preferred)
        if candidates:
            n = candidates[0]
            stats.ma[layer] = bare[(n, layer + 1)] - bare[(n, layer)]
            if stats.workspaces is not None and (layer, layer + 1) not in held:
                stats.workspaces[layer] = held[(n, layer + 1)]  # a superset of the layer's own
    return stats


def _vector_of(workspaces: dict[str, int]) -> np.ndarray:
    """A span's workspaces as a statistic vector: in its ``static`` and its measured ``peak``."""
    v = np.zeros(len(STATISTIC_QUANTITIES))
    v[_HELD_IN] = sum(workspaces.values())
    return v


def statistics_of(
    store: ProfileStore,
    scenario: Scenario,
    batch: int,
    num_units: int,
    anchor: Callable[[int], int] | None,
    bounds: list[int] | None = None,
    recompute: bool = False,
) -> SpanStatistics | None:
    """The statistics of one scenario at one profiled batch size, from the stored measurements (None if none)."""
    ms = store.measurements(kind=scenario.measured_kind, degree=scenario.degree, batch_size=batch)
    return build_statistics(ms, num_layers=num_units, anchor=anchor, bounds=bounds, recompute=recompute,
                            sharded=scenario.zero == 3) if ms else None


def load_statistics(store: ProfileStore) -> dict[tuple[str, int], list[SpanStatistics]]:
    """Every scenario's statistics at every profiled batch size, from the stored measurements."""
    meta = store.meta()
    if "num_layers" not in meta:
        return {}
    L = meta["num_layers"]
    bounds = meta.get("merge_groups")
    recompute = bool(((meta.get("identity") or {}).get("run_options") or {}).get("activation_checkpointing", False))
    out: dict[tuple[str, int], list[SpanStatistics]] = {}
    for name in meta.get("scenarios", []):
        scenario = Scenario.parse(name)
        anchor = anchor_of(meta.get("neighbors", {}).get(name, 1))
        merged = bounds if bounds is not None and scenario.degree > 1 else None
        for batch in [*meta["batch_sizes"], *meta.get("replica_batch_sizes", [])]:  # a scenario not profiled at
            # one (profiling/campaign.py [Note: a replica's rows are measured]) has no statistics there
            stats = statistics_of(store, scenario, batch, L if merged is None else len(merged) - 1, anchor, merged,
                                  recompute=recompute)
            if stats is not None:
                out.setdefault((scenario.measured_kind, scenario.degree), []).append(stats)
    return out


def anchor_of(neighbors: int) -> Callable[[int], int]:
    """The neighbour-chain anchor of layer ``l`` for chains of ``neighbors`` layers (Description 1)."""
    return lambda l: ((l - 1) // neighbors) * neighbors

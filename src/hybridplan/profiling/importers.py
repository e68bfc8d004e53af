"""Importers that turn third-party layer profiles into a :class:`~hybridplan.profiling.time_profile.TimeProfile`.

PipeDream ``graph.txt`` (Narayanan et al. SOSP'19; github.com/msr-fiddle/pipedream, profiler output)
    A DAG of modules. Node line ``nodeID -- <module> -- forward_compute_time=<ms>, backward_compute_time=<ms>,
    activation_size=<bytes>, parameter_size=<bytes>`` (``activation_size`` may be a list ``[a; b]`` for a
    module with several outputs: we sum it); edge line ``<TAB>nodeA -- nodeB``. Times are milliseconds for the
    whole profiled minibatch, sizes bytes for the whole minibatch (activations) and fp32 weights (parameters).

    [Note: linearising a DAG] The planner cuts a *chain*. We order the nodes topologically (Kahn's algorithm;
    among ready nodes the smallest node number first, which is the profiler's trace order) and make each node a
    layer. A cut after chain position ``p`` must ship every output produced at or before ``p`` that a node
    after ``p`` still reads - on a branchy graph (ResNet skip connections, Inception towers, GNMT's residual
    LSTMs) that is several tensors. So a layer's ``activation_bytes_per_sample`` is the sum of the outputs of
    all nodes at positions <= p with a consumer at a position > p (for the last layer: its own output). This
    is exact for cuts of the chosen order; a cut inside a branch is legal but usually ships more than a cut
    where the branches have joined, which the planner sees and avoids. "Input" nodes stay in the chain (their
    outputs may be read by later nodes, e.g. GNMT), but their forward time is data loading, not compute
    (the data README's caveat: alexnet's "Input" reports 636 ms), so it is set to zero.

AMP ``known_cost/<model>_<instance>_<tp>.npy`` (Li et al. NeurIPS'22, seed 002; github.com/MccRee177/AMP)
    One float64 vector per tensor-parallel degree: the forward seconds of each DeepSpeed layer spec for a
    micro-batch of 1, measured inside a tensor-parallel group of that size (so tensor-parallel communication is
    in the times). AMP takes backward = 2 x forward (its ``cost_homo.py``: "We model backward time as forward
    time * 2"); the files hold no sizes, so the caller describes the layers (:func:`amp_gpt2_layers` for GPT-2).

Both formats hold ONE micro-batch size per layer, and no optimizer step or per-iteration overhead. An imported
profile is therefore read as before: layer time proportional to the samples of a micro-batch (AMP section 3.4;
[Note: time vs micro-batch size] in timing_table.py: with one size, the roofline's fixed cost is 0), and the
time model adds no step and no overhead term (``optimizer_s_per_byte`` and ``overhead_s`` are null). Neither
holds a link measurement nor parameter tensor counts: ``links`` and ``parameter_tensors`` are null, so the time
model charges no per-message latency (alpha = 0, AMP's own bandwidth-only model) unless the cluster file gives
one ([Note: per-message latency] in predict/communication.py).

Several device types in one profile (:func:`merge_device_types`)
    A mixed cluster (T4 nodes beside V100 nodes) is timed from ONE profile that holds a timing table per device
    type: the time model runs each device on its own type's times (predict/time_model.py). The merger joins
    profiles of the same model measured on different device types - AMP's ``gpt2_G4_*`` and ``gpt2_P3_*``
    files, or layer-time JSON files measured on each type - after checking that they describe the same layers.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from hybridplan.errors import ProfileError
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable

__all__ = [
    "PipeDreamNode",
    "PipeDreamGraph",
    "read_pipedream_graph",
    "import_pipedream_graph",
    "AMP_BACKWARD_FACTOR",
    "AMP_INSTANCE_DEVICE",
    "amp_gpt2_layers",
    "import_amp_known_cost",
    "load_amp_gpt2",
    "merge_device_types",
]

AMP_BACKWARD_FACTOR = 2.0
"""Backward seconds per forward second in AMP's cost model (AMP repository, ``cost_homo.py``)."""

AMP_INSTANCE_DEVICE: Mapping[str, str] = {"G4": "T4", "P3": "V100"}
"""AMP file-name instance -> GPU: g4dn.12xlarge has 4 T4, p3.8xlarge 4 V100 (seed 002 section 4.3)."""

_NODE = re.compile(
    r"^(?P<id>\S+) -- (?P<desc>.*) -- forward_compute_time=(?P<fwd>[^,]+), backward_compute_time=(?P<bwd>[^,]+),"
    r" activation_size=(?P<act>.+), parameter_size=(?P<param>[^,]+)$"
)
_EDGE = re.compile(r"^\t(?P<a>\S+) -- (?P<b>\S+)$")
_MS = 1e-3
"""Seconds per millisecond (PipeDream profiles are in ms)."""


@dataclass(frozen=True)
class PipeDreamNode:
    """One node of a PipeDream profile graph (values as in the file: ms and bytes for the whole minibatch)."""

    id: str
    description: str
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    parameter_bytes: float

    @property
    def is_input(self) -> bool:
        """Whether the node is a data input (its forward time is data loading)."""
        return self.description.startswith("Input")


@dataclass(frozen=True)
class PipeDreamGraph:
    """A parsed ``graph.txt``: nodes in file order and edges ``(producer, consumer)``."""

    nodes: tuple[PipeDreamNode, ...]
    edges: tuple[tuple[str, str], ...]

    def topological_order(self) -> tuple[str, ...]:
        """Node ids in topological order, smallest node number first among ready nodes (see the note).

        Raises:
            ProfileError: if the graph has a cycle.
        """
        succ: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        indeg = {n.id: 0 for n in self.nodes}
        for a, b in self.edges:
            succ[a].append(b)
            indeg[b] += 1
        ready = [(_node_key(n), n) for n, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for m in succ[n]:
                indeg[m] -= 1
                if indeg[m] == 0:
                    heapq.heappush(ready, (_node_key(m), m))
        if len(order) != len(self.nodes):
            stuck = sorted(n for n, d in indeg.items() if d > 0)[:5]
            raise ProfileError(f"the PipeDream graph has a cycle through node(s) {stuck}", fix="a profile graph must be a DAG")
        return tuple(order)

    def boundary_bytes(self, order: Sequence[str]) -> np.ndarray:
        """Bytes crossing a cut after each position of ``order`` (the note), for the whole minibatch."""
        pos = {n: i for i, n in enumerate(order)}
        act = {n.id: n.activation_bytes for n in self.nodes}
        last_use = dict(pos)
        for a, b in self.edges:
            last_use[a] = max(last_use[a], pos[b])
        diff = np.zeros(len(order) + 1)
        for n, p in pos.items():
            if last_use[n] > p:  # live on cuts p, p+1, ..., last_use - 1
                diff[p] += act[n]
                diff[last_use[n]] -= act[n]
        crossing = np.cumsum(diff)[:-1]
        crossing[-1] = act[order[-1]]
        return crossing


def read_pipedream_graph(path: str | Path) -> PipeDreamGraph:
    """Parse a PipeDream profiler ``graph.txt``.

    Raises:
        ProfileError: if the file is missing, a line is malformed, or an edge names an unknown node.
    """
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except FileNotFoundError:
        raise ProfileError(f"PipeDream graph {str(p)!r} does not exist", fix="check the path") from None
    nodes: list[PipeDreamNode] = []
    edges: list[tuple[str, str]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p.name} line {lineno}"
        edge = _EDGE.match(line)
        if edge:
            edges.append((edge["a"], edge["b"]))
            continue
        node = _NODE.match(line)
        if node is None:
            raise ProfileError(
                f"{where} is neither a node nor an edge: {line[:80]!r}",
                fix="node lines read 'nodeID -- <module> -- forward_compute_time=..., backward_compute_time=...,"
                " activation_size=..., parameter_size=...'; edge lines '<TAB>nodeA -- nodeB'",
            )
        nodes.append(
            PipeDreamNode(
                id=node["id"],
                description=node["desc"].strip(),
                forward_ms=_float(node["fwd"], f"{where}: forward_compute_time"),
                backward_ms=_float(node["bwd"], f"{where}: backward_compute_time"),
                activation_bytes=_activation(node["act"], f"{where}: activation_size"),
                parameter_bytes=_float(node["param"], f"{where}: parameter_size"),
            )
        )
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ProfileError(f"{p.name}: node id(s) {dup} defined twice")
    known = set(ids)
    for a, b in edges:
        for n in (a, b):
            if n not in known:
                raise ProfileError(f"{p.name}: edge {a} -- {b} names node {n!r}, which has no node line")
    if not nodes:
        raise ProfileError(f"{p.name} holds no nodes", fix="is this a PipeDream profile graph.txt?")
    return PipeDreamGraph(tuple(nodes), tuple(edges))


def import_pipedream_graph(
    path: str | Path, *, batch_size: int, device_type: str = "pipedream-gpu", model: str | None = None
) -> TimeProfile:
    """A PipeDream profile as a :class:`TimeProfile` over the linearised chain (see the note).

    Args:
        path: the ``graph.txt``.
        batch_size: samples of the profiled minibatch (not in the file; e.g. vgg16 128, alexnet 256, as
            /work/shared/data/pipedream/README.txt infers from the Input activation size).
        device_type: name for the (unrecorded) GPU the profile was taken on.
        model: profile name (default: the file name without ``.graph.txt``).

    Returns:
        One timing table (tensor degree 1, micro-batch ``batch_size``); times in seconds; activations per
        sample; parameters as fp32 gradient bytes.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ProfileError(f"batch_size must be a positive integer (the profiled minibatch), got {batch_size!r}")
    graph = read_pipedream_graph(path)
    order = graph.topological_order()
    by_id = {n.id: n for n in graph.nodes}
    crossing = graph.boundary_bytes(order)
    chain = [by_id[n] for n in order]
    layers = tuple(
        LayerInfo(
            name=f"{n.id}: {n.description[:60]}",
            activation_bytes_per_sample=float(crossing[i]) / batch_size,
            parameter_bytes=n.parameter_bytes,
        )
        for i, n in enumerate(chain)
    )
    timing = TimingTable(
        device_type=device_type,
        tensor_degree=1,
        micro_batch_size=batch_size,
        forward_s=tuple(0.0 if n.is_input else n.forward_ms * _MS for n in chain),
        backward_s=tuple(n.backward_ms * _MS for n in chain),
    )
    name = model or Path(path).name.removesuffix(".txt").removesuffix(".graph")
    return TimeProfile(
        model=name,
        layers=layers,
        timings=(timing,),
        source=f"PipeDream profiler graph {Path(path).name}, minibatch {batch_size}, linearised topologically",
    )


def amp_gpt2_layers(
    *,
    num_layers: int = 24,
    hidden: int = 1024,
    seq_len: int = 1024,
    vocab: int = 52256,
    activation_element_bytes: int = 2,
    gradient_element_bytes: int = 4,
) -> tuple[LayerInfo, ...]:
    """The ``num_layers + 6`` DeepSpeed layer specs of AMP's GPT-2 (data README: embedding | transpose |
    blocks | transpose | final layernorm | logits | fp16->fp32 cast), with sizes from the model shape.

    Defaults: AMP's GPT-2 (seed 002 section 6.5.1: hidden 1024, sequence 1024, vocabulary 52256, 24 layers),
    fp16 activations, and 4-byte gradients because its DeepSpeed config sets ``"fp32_allreduce": true``
    (/work/shared/data/amp/ds_config.json). Parameter counts: a Megatron block has 12h^2 + 13h (QKV 3h^2+3h,
    projection h^2+h, MLP 8h^2+5h, two layernorms 4h); the tied word embedding v*h plus positions s*h; the
    logits layer reuses the word embedding (``shared_parameters="word_embeddings"``). The logits output is
    counted at full vocabulary width whatever the tensor degree (an over-estimate for a cut right after it).
    """
    sh = seq_len * hidden * activation_element_bytes
    g = gradient_element_bytes
    specs = [
        LayerInfo(name="embedding", activation_bytes_per_sample=sh, parameter_bytes=(vocab + seq_len) * hidden * g,
                  shared_parameters="word_embeddings"),
        LayerInfo(name="transpose bsh->sbh", activation_bytes_per_sample=sh, parameter_bytes=0),
    ]
    specs += [
        LayerInfo(name=f"block{i}", activation_bytes_per_sample=sh, parameter_bytes=(12 * hidden**2 + 13 * hidden) * g,
                  tensor_parallel_allreduces=(2, 2))
        for i in range(num_layers)
    ]
    specs += [
        LayerInfo(name="transpose sbh->bsh", activation_bytes_per_sample=sh, parameter_bytes=0),
        LayerInfo(name="final_layernorm", activation_bytes_per_sample=sh, parameter_bytes=2 * hidden * g),
        LayerInfo(name="logits", activation_bytes_per_sample=seq_len * vocab * activation_element_bytes,
                  parameter_bytes=vocab * hidden * g, shared_parameters="word_embeddings"),
        LayerInfo(name="fp16_to_fp32", activation_bytes_per_sample=seq_len * vocab * 4, parameter_bytes=0),
    ]
    return tuple(specs)


def import_amp_known_cost(
    files: Mapping[int, str | Path],
    *,
    layers: Sequence[LayerInfo],
    device_type: str,
    model: str,
    micro_batch_size: int = 1,
    backward_factor: float = AMP_BACKWARD_FACTOR,
) -> TimeProfile:
    """AMP ``known_cost`` vectors (one file per tensor degree) as a :class:`TimeProfile`.

    Args:
        files: tensor-parallel degree -> ``.npy`` path of forward seconds per layer spec.
        layers: the layer specs the vectors index (sizes are not in the files).
        device_type: GPU the files were measured on (:data:`AMP_INSTANCE_DEVICE`).
        model: profile name.
        micro_batch_size: samples per measured micro-batch (1 in AMP's data).
        backward_factor: backward seconds per forward second.

    Raises:
        ProfileError: for a missing or malformed file, or a length that does not match ``layers``.
    """
    if not files:
        raise ProfileError("no AMP known_cost files given", fix="pass {tensor_degree: path}, e.g. {1: 'gpt2_G4_1.npy'}")
    timings = []
    for tp, path in sorted(files.items()):
        p = Path(path)
        try:
            fwd = np.load(p, allow_pickle=False)
        except FileNotFoundError:
            raise ProfileError(f"AMP cost file {str(p)!r} does not exist", fix="check the known_cost directory") from None
        except ValueError as e:
            raise ProfileError(f"AMP cost file {str(p)!r} is not a numeric .npy array: {e}") from None
        if fwd.ndim != 1 or fwd.dtype.kind not in "fi":
            raise ProfileError(f"AMP cost file {p.name} must hold a 1-D float vector, got shape {fwd.shape} of {fwd.dtype}")
        if len(fwd) != len(layers):
            raise ProfileError(
                f"AMP cost file {p.name} has {len(fwd)} layer times but {len(layers)} layers were described",
                fix="describe exactly the layer specs the file was measured on (GPT-2: amp_gpt2_layers with its num_layers)",
            )
        fwd = fwd.astype(float)
        timings.append(
            TimingTable(device_type=device_type, tensor_degree=int(tp), micro_batch_size=micro_batch_size,
                        forward_s=tuple(fwd.tolist()), backward_s=tuple((fwd * backward_factor).tolist()))
        )
    names = ", ".join(Path(f).name for _, f in sorted(files.items()))
    return TimeProfile(
        model=model,
        layers=tuple(layers),
        timings=tuple(timings),
        tensor_comm_in_times=True,
        source=f"AMP known_cost {names}; backward = {backward_factor} x forward (AMP cost_homo.py)",
    )


def load_amp_gpt2(known_cost_dir: str | Path, instance: str = "G4") -> TimeProfile:
    """AMP's GPT-2 profile for ``instance`` ("G4": T4, "P3": V100) from every ``gpt2_<instance>_<tp>.npy``.

    Raises:
        ProfileError: if the directory holds no such file or the instance is unknown.
    """
    if instance not in AMP_INSTANCE_DEVICE:
        raise ProfileError(f"unknown AMP instance {instance!r}", fix=f"use one of {sorted(AMP_INSTANCE_DEVICE)}")
    d = Path(known_cost_dir)
    names = (re.fullmatch(rf"gpt2_{instance}_(\d+)\.npy", f.name) for f in sorted(d.glob("*.npy")))
    files = {int(m[1]): d / m[0] for m in names if m}
    if not files:
        raise ProfileError(f"no gpt2_{instance}_<tp>.npy files in {str(d)!r}", fix="point at AMP's known_cost directory")
    return import_amp_known_cost(
        files, layers=amp_gpt2_layers(), device_type=AMP_INSTANCE_DEVICE[instance], model=f"gpt2-amp-{instance}"
    )


def merge_device_types(profiles: Sequence[TimeProfile], *, model: str | None = None) -> TimeProfile:
    """ONE time profile holding the timing tables of every profile, e.g. one per device type.

    The first profile's first device type stays the reference (what a device of an unprofiled type runs,
    scaled by its speed). The layers are the model's, so they must agree exactly (names, sizes, all-reduces,
    shared parameters), and so must ``tensor_comm_in_times``, which the time model applies to every table.

    Args:
        profiles: two or more profiles of one model (one is returned as is).
        model: the merged profile's name (default: the first profile's).

    Raises:
        ProfileError: for no profile, layers that differ (naming the first difference), a different
            ``tensor_comm_in_times``, or a (device type, tensor degree, micro-batch size) timed twice.

    Example:
        >>> from hybridplan.profiling.layer_info import LayerInfo
        >>> from hybridplan.profiling.timing_table import TimingTable
        >>> layer = LayerInfo(name="l0", activation_bytes_per_sample=8.0, parameter_bytes=16.0)
        >>> def on(device: str, s: float) -> TimeProfile:
        ...     return TimeProfile(model="m", layers=(layer,), timings=(TimingTable(device_type=device,
        ...         tensor_degree=1, micro_batch_size=1, forward_s=(s,), backward_s=(2 * s,)),))
        >>> merge_device_types([on("T4", 3.0), on("V100", 1.0)]).device_types
        ('T4', 'V100')
    """
    if not profiles:
        raise ProfileError("no time profiles to merge", fix="give one profile per device type")
    first = profiles[0]
    seen: dict[tuple[str, int, int], int] = {}
    for i, p in enumerate(profiles):
        if p.num_layers != first.num_layers:
            raise ProfileError(f"profile {i} ({p.model!r}) has {p.num_layers} layers, profile 0 ({first.model!r})"
                               f" has {first.num_layers}", fix="merge profiles of the same model, cut into the same layers")
        for j, (a, b) in enumerate(zip(first.layers, p.layers)):
            if a != b:
                field_name = next(f.name for f in fields(a) if getattr(a, f.name) != getattr(b, f.name))
                raise ProfileError(
                    f"layer {j} differs between profile 0 and profile {i}: {field_name} {getattr(a, field_name)!r}"
                    f" against {getattr(b, field_name)!r}",
                    fix="merge profiles of the same model, cut into the same layers (only the times may differ)")
        if p.tensor_comm_in_times != first.tensor_comm_in_times:
            raise ProfileError(
                f"profile {i} says tensor_comm_in_times={p.tensor_comm_in_times}, profile 0 says"
                f" {first.tensor_comm_in_times}: the time model would add tensor-parallel all-reduces to one and not"
                " the other", fix="merge profiles measured the same way (both inside tensor-parallel groups, or neither)")
        for t in p.timings:
            if t.key in seen:
                raise ProfileError(f"device type {t.device_type!r}, tensor degree {t.tensor_degree}, micro-batch size"
                                   f" {t.micro_batch_size} is timed by profile {seen[t.key]} and profile {i}",
                                   fix="merge one profile per device type (or drop the repeated table)")
            seen[t.key] = i
    if len(profiles) == 1:
        return first
    sources = "; ".join(f"{', '.join(p.device_types)}: {p.source or p.model}" for p in profiles)
    return TimeProfile(model=model or first.model, layers=first.layers,
                       timings=tuple(t for p in profiles for t in p.timings),
                       tensor_comm_in_times=first.tensor_comm_in_times, source=f"merged: {sources}")


def _node_key(node_id: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", node_id)
    return (int(digits) if digits else -1, node_id)


def _float(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"{where} must be a number, got {text!r}") from None
    if not np.isfinite(value) or value < 0:
        raise ProfileError(f"{where} must be a finite number >= 0, got {text!r}")
    return value


def _activation(text: str, where: str) -> float:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        parts = [t for t in text[1:-1].split(";") if t.strip()]
        return float(sum(_float(t.strip(), where) for t in parts))
    return _float(text, where)

"""One pipeline stage of a plan: its layers, its devices, how they share the work; the stage's JSON form.

``layers`` is half-open ``[start, stop)`` over the model's layers; ``devices`` are global device
indices (node = index // devices per node). ``parallelism`` is "none", "data", "tensor" or
"data+tensor"; a "data+tensor" stage also gives ``tensor_degree``, which divides ``degree``: its data
degree is ``degree / tensor_degree`` and its devices are listed tensor-fastest (``devices[0:t]`` is the
first tensor group, the rank order of Megatron-LM and AMP). So every stage has a data degree (replicas
that split each micro-batch) and a tensor degree (devices that split each layer):

=============  ===========  =============
parallelism    data degree  tensor degree
=============  ===========  =============
none           1            1
data           degree       1
tensor         1            degree
data+tensor    degree / t   t
=============  ===========  =============

``zero`` (ZeRO sharding: 0, 1 optimizer state, 2 + gradients, 3 + parameters) and ``recompute`` ("none";
"full": activation checkpointing of every layer of the stage; "selective": torchtitan's per-operation policy on
the stage's blocks, runtime/checkpointing.py) are checked here, each on its own; the rules
that need the whole plan (coverage, degrees against the micro-batch, devices) are in
:mod:`hybridplan.plan.rules`. The plan's JSON form is in :mod:`hybridplan.plan.plan`. This module imports no
torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from hybridplan.errors import PlanError
from hybridplan.limits import MAX_LAYERS, count_problem, shown
from hybridplan.plan.cluster import MAX_DEVICES

__all__ = ["PARALLELISMS", "Parallelism", "RECOMPUTES", "Recompute", "ZERO_STAGES", "StagePlan", "USER_PREFIX"]

Parallelism = Literal["none", "data", "tensor", "data+tensor"]
"""How a stage's devices share its work."""

PARALLELISMS: tuple[Parallelism, ...] = get_args(Parallelism)
"""Per-stage parallelism kinds."""

Recompute = Literal["none", "full", "selective"]
"""Activation recompute of a stage: none; "full", every layer checkpointed (its inputs kept, the rest recomputed);
"selective", torchtitan's per-operation policy on the blocks between the embedding and the head (every second
matrix product's output and the attention's kept, the rest recomputed: runtime/checkpointing.py). The searches
choose between none and full; "selective" is a plan a user trains with torchtitan, simulated, not composed."""

RECOMPUTES: tuple[Recompute, ...] = get_args(Recompute)

ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
"""ZeRO sharding over a stage's data-parallel group: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters
(Rajbhandari et al., SC 2020; FSDP's FULL_SHARD is 3)."""

_STAGE_KEYS = ("layers", "parallelism", "degree", "devices")
_OPTIONAL_STAGE_KEYS = ("tensor_degree", "zero", "recompute")

USER_PREFIX = "x-"
"""A plan's or a stage's key starting with this is the user's annotation, kept and never read; any other unknown key
is refused (a misspelt ``"zeroo": 3`` would otherwise leave the stage without ZeRO, silently)."""


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: layers ``[start, stop)`` run with ``parallelism`` on ``devices``.

    ``tensor_degree`` is the devices that split each layer; it is derived from ``parallelism`` and
    ``degree`` (``degree`` for "tensor", 1 for "none" and "data") and must be given only for "data+tensor".

    Raises:
        PlanError: for an unknown parallelism, or a tensor degree that does not go with it.
    """

    start: int
    stop: int
    parallelism: Parallelism
    degree: int
    devices: tuple[int, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    tensor_degree: int = 0
    """Devices splitting each layer (0 when constructing: derived from ``parallelism``)."""
    zero: int = 0
    """ZeRO sharding over the data-parallel group (:data:`ZERO_STAGES`); only for a data degree above 1."""
    recompute: Recompute = "none"
    """Activation recompute of the stage's layers (:data:`Recompute`)."""

    def __post_init__(self) -> None:
        unknown = sorted(k for k in self.extra if not str(k).startswith(USER_PREFIX))
        if unknown:
            raise PlanError(f"unknown key(s) {', '.join(shown(k) for k in unknown[:5])}",
                            fix=f"the keys of a stage are {list(_STAGE_KEYS + _OPTIONAL_STAGE_KEYS)}; start an annotation"
                            f" of your own with {USER_PREFIX!r} (e.g. \"x-note\")")
        if isinstance(self.zero, bool) or self.zero not in ZERO_STAGES:
            raise PlanError(f"zero must be one of {list(ZERO_STAGES)}, got {self.zero!r}",
                            fix="0: no sharding; 1: optimizer state; 2: + gradients; 3: + parameters (FSDP)")
        if self.recompute not in RECOMPUTES:
            raise PlanError(f"unknown recompute {shown(self.recompute)}", fix=f"use one of {list(RECOMPUTES)}")
        if self.parallelism not in PARALLELISMS:
            raise PlanError(f"unknown parallelism {shown(self.parallelism)}", fix=f"use one of {list(PARALLELISMS)}")
        derived = {"none": 1, "data": 1, "tensor": self.degree}.get(self.parallelism)
        if derived is not None:
            if self.tensor_degree not in (0, derived):
                raise PlanError(f"tensor_degree {self.tensor_degree} does not go with parallelism {self.parallelism!r}",
                                fix="give tensor_degree only for 'data+tensor' stages")
            object.__setattr__(self, "tensor_degree", derived)
            return
        t = self.tensor_degree
        if t < 1 or self.degree < 1 or self.degree % t:
            raise PlanError(
                f"a 'data+tensor' stage needs a tensor_degree dividing its degree {self.degree}, got {t or 'none'}",
                fix='e.g. "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2 (2 replicas of 2 devices)',
            )

    @classmethod
    def of(cls, start: int, stop: int, devices: Sequence[int], *, data_degree: int = 1, tensor_degree: int = 1,
           zero: int = 0, recompute: Recompute = "none", extra: Mapping[str, Any] | None = None) -> StagePlan:
        """The stage of ``data_degree`` replicas of ``tensor_degree`` devices each (``devices`` tensor-fastest),
        labelled with the simplest parallelism that says so."""
        kind: Parallelism = ("data+tensor" if data_degree > 1 and tensor_degree > 1 else "tensor" if tensor_degree > 1
                             else "data" if data_degree > 1 else "none")
        return cls(start, stop, kind, data_degree * tensor_degree, tuple(devices), dict(extra or {}),
                   tensor_degree if kind == "data+tensor" else 0, zero, recompute)

    @property
    def layers(self) -> range:
        """The stage's layer indices."""
        return range(self.start, self.stop)

    @property
    def num_layers(self) -> int:
        """How many layers the stage holds."""
        return self.stop - self.start

    @property
    def data_degree(self) -> int:
        """Replicas splitting each micro-batch."""
        return self.degree // self.tensor_degree if self.tensor_degree else self.degree

    @property
    def kind(self) -> Parallelism:
        """What the stage computes, whatever its label: "none" for one device, "data" x1 x "tensor" x2 is "tensor"."""
        d, t = self.data_degree, self.tensor_degree
        return "data+tensor" if d > 1 and t > 1 else "tensor" if t > 1 else "data" if d > 1 else "none"

    def tensor_group(self, replica: int) -> tuple[int, ...]:
        """The devices of replica ``replica``: one tensor-parallel group."""
        t = self.tensor_degree
        return self.devices[replica * t : (replica + 1) * t]

    def data_group(self, tensor_rank: int) -> tuple[int, ...]:
        """The devices of tensor rank ``tensor_rank`` in every replica: one data-parallel all-reduce group."""
        return self.devices[tensor_rank :: self.tensor_degree]

    def describe(self) -> str:
        """E.g. ``layers [3, 7) tensor x2 on devices [2, 3]``."""
        how = (f"data x{self.data_degree} + tensor x{self.tensor_degree}" if self.parallelism == "data+tensor"
               else f"{self.parallelism} x{self.degree}")
        if self.zero:
            how += f" ZeRO-{self.zero}"
        if self.recompute != "none":
            how += f" recompute {self.recompute}"
        return f"layers [{self.start}, {self.stop}) {how} on devices {list(self.devices)}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of the stage."""
        out: dict[str, Any] = {
            "layers": [self.start, self.stop],
            "parallelism": self.parallelism,
            "degree": self.degree,
        }
        if self.parallelism == "data+tensor":
            out["tensor_degree"] = self.tensor_degree
        if self.zero:
            out["zero"] = self.zero
        if self.recompute != "none":
            out["recompute"] = self.recompute
        out["devices"] = list(self.devices)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Any, index: int) -> StagePlan:
        """Parse one stage, checking keys and types."""
        where = f"stage {index}"
        if not isinstance(data, Mapping):
            raise PlanError(f"{where} must be an object with keys {list(_STAGE_KEYS)}, got {shown(data)}",
                            fix='write e.g. {"layers": [0, 3], "parallelism": "none", "degree": 1, "devices": [0]}')
        missing = [k for k in _STAGE_KEYS if k not in data]
        if missing:
            raise PlanError(f"{where} lacks key(s) {missing}", fix=f"every stage needs {list(_STAGE_KEYS)}")
        layers = data["layers"]
        if (
            not isinstance(layers, Sequence)
            or isinstance(layers, str)
            or len(layers) != 2
            or not all(_is_int(v) and 0 <= v <= MAX_LAYERS for v in layers)
        ):
            raise PlanError(
                f"{where}: 'layers' must be [start, stop) as two integers from 0 to {MAX_LAYERS:,}, got {shown(layers)}",
                fix='write e.g. "layers": [0, 3] for layers 0, 1 and 2',
            )
        if not isinstance(data["parallelism"], str):
            raise PlanError(f"{where}: 'parallelism' must be one of {list(PARALLELISMS)}, got {shown(data['parallelism'])}",
                            fix=f"use one of {list(PARALLELISMS)}")
        for key in ("degree", "tensor_degree"):
            problem = count_problem(data[key], MAX_DEVICES, why="the devices of the largest cluster") if key in data else None
            if problem is not None:
                raise PlanError(f"{where}: '{key}' {problem}", fix=f"give '{key}' as the number of devices it names")
        tensor = data.get("tensor_degree", 0)
        zero, recompute = data.get("zero", 0), data.get("recompute", "none")
        if not _is_int(zero):
            raise PlanError(f"{where}: 'zero' must be an integer (0 to 3), got {shown(zero)}",
                            fix="0: no sharding; 1: optimizer state; 2: + gradients; 3: + parameters (FSDP)")
        if not isinstance(recompute, str):
            raise PlanError(f"{where}: 'recompute' must be one of {list(RECOMPUTES)}, got {shown(recompute)}",
                            fix=f"use one of {list(RECOMPUTES)}")
        devices = data["devices"]
        if (not isinstance(devices, Sequence) or isinstance(devices, str)
                or not all(_is_int(d) and 0 <= d < MAX_DEVICES for d in devices)):
            raise PlanError(f"{where}: 'devices' must be a list of device indices from 0 to {MAX_DEVICES - 1:,},"
                            f" got {shown(devices)}", fix="list the stage's devices, e.g. \"devices\": [0, 1]")
        extra = {k: v for k, v in data.items() if k not in _STAGE_KEYS + _OPTIONAL_STAGE_KEYS}
        try:
            return cls(int(layers[0]), int(layers[1]), cast(Parallelism, data["parallelism"]), int(data["degree"]),
                       tuple(int(d) for d in devices), extra, int(tensor), int(zero), cast(Recompute, recompute))
        except PlanError as e:
            raise PlanError(f"{where}: {e.message}", fix=e.fix) from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

"""The time profile a profile database holds: the layer times ``profile --time`` recorded, as a
:class:`~hybridplan.profiling.time_profile.TimeProfile`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hybridplan.errors import ProfileError
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.links import LinkCosts
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable

if TYPE_CHECKING:
    from hybridplan.profiling.store import ProfileStore

__all__ = ["time_profile_from_store"]


def time_profile_from_store(store: ProfileStore, *, warn: Callable[[str], None] | None = None) -> TimeProfile:
    """The database's layer times as a :class:`TimeProfile` (written by profiling/timing.py: see its docstring and [Note: layers that cannot be split] there).

    A (device type, degree, micro-batch size) with a layer missing (a failed or unfinished run) is left out,
    and ``warn`` is told.

    Raises:
        ProfileError: if the database holds no complete timing table.
    """
    meta = store.meta()
    say = warn or (lambda msg: print(msg, file=sys.stderr))
    if "time_layers" not in meta:
        raise ProfileError(f"{str(store.path)!r} holds no layer times", fix="measure them with 'hybridplan profile --time'")
    layers = tuple(LayerInfo(name=d["name"], activation_bytes_per_sample=d["activation_bytes_per_sample"],
                             parameter_bytes=d["parameter_bytes"],
                             tensor_parallel_allreduces=tuple(d["tensor_parallel_allreduces"]),
                             shared_parameters=d.get("shared_parameters"), parameter_tensors=d.get("parameter_tensors"))
                   for d in meta["time_layers"])
    unsplittable = {int(t): set(ls) for t, ls in (meta.get("time_unsplittable") or {}).items()}
    times = store.layer_times()
    costs = store.run_costs()
    tables = []
    for (dtype, t, b), rows in sorted(times.items()):
        fwd, bwd = [], []
        for l in range(len(layers)):
            row = rows.get(l)
            if row is None and l in unsplittable.get(t, ()):
                row = times.get((dtype, 1, b), {}).get(l)
            if row is None:
                break
            fwd.append(row[0])
            bwd.append(row[1])
        if len(fwd) < len(layers):
            say(f"layer times of {dtype!r} at tensor degree {t}, micro-batch {b} are incomplete (layer {len(fwd)}"
                " missing): left out; run 'hybridplan profile --time' again to finish them")
            continue
        rate, overhead = _costs_of(costs.get((dtype, t, b), []))
        tables.append(TimingTable(device_type=dtype, tensor_degree=t, micro_batch_size=b, forward_s=tuple(fwd),
                                  backward_s=tuple(bwd), optimizer_s_per_byte=rate, overhead_s=overhead))
    if not tables:
        raise ProfileError(f"{str(store.path)!r} holds no complete layer-time table",
                           fix="run 'hybridplan profile --time' until it finishes")
    identity = meta.get("time_identity", {})
    source = (f"hybridplan profile --time: runtime hooks, median of micro-batches per layer, slowest tensor rank;"
              f" {identity.get('device', 'cpu')} devices, {identity.get('precision', 'fp32')}")
    cores = meta.get("time_host_cores")
    links = meta.get("time_links")
    return TimeProfile(model=str(identity.get("model", meta.get("model", "model"))), layers=layers,
                       timings=tuple(tables), tensor_comm_in_times=True, source=source,
                       host_cores=int(cores) if cores is not None else None,
                       links=LinkCosts.from_dict(links, f"{str(store.path)!r}: time_links") if links is not None else None)


def _costs_of(runs: Sequence[tuple[int, int, float, float, float]]) -> tuple[float | None, float | None]:
    """(optimizer seconds per parameter byte, overhead seconds) of one timing table from its runs' costs
    (profiling/timing.py, [Note: optimizer step and overhead]): the steps of all chunk runs over all their bytes;
    the largest overhead of a chunk run (each pays the per-iteration costs once, as one stage would)."""
    if not runs:
        return None, None
    nbytes = sum(r[2] for r in runs)
    rate = sum(r[3] for r in runs) / nbytes if nbytes > 0 else None
    return rate, max(r[4] for r in runs)

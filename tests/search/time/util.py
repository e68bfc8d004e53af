"""What the throughput-search tests share: every cut of a layer chain, and a toy time profile on a 2 x 2 mesh."""

from __future__ import annotations

import itertools

import numpy as np

from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable


def all_cuts(num_layers: int, k: int) -> list[tuple[int, ...]]:
    """Every way to cut ``num_layers`` layers into ``k`` non-empty stages, as boundaries ``(0, ..., L)``."""
    return [(0, *c, num_layers) for c in itertools.combinations(range(1, num_layers), k - 1)]


def toy_profile(params: float = 0.0, num_layers: int = 4) -> TimeProfile:
    """Random layer times (seed 7) on device type "A", at tensor degrees 1 and 2 (0.6x the time)."""
    rng = np.random.default_rng(7)
    fwd = tuple(rng.uniform(1e-3, 5e-3, num_layers))
    return TimeProfile(
        model="toy",
        layers=tuple(
            LayerInfo(name=f"l{i}", activation_bytes_per_sample=float(rng.uniform(1e4, 1e6)), parameter_bytes=params,
                      tensor_parallel_allreduces=(2, 2))
            for i in range(num_layers)
        ),
        timings=(
            TimingTable(device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=fwd, backward_s=tuple(2 * f for f in fwd)),
            TimingTable(device_type="A", tensor_degree=2, micro_batch_size=1, forward_s=tuple(0.6 * f for f in fwd),
                        backward_s=tuple(1.2 * f for f in fwd)),
        ),
    )


TOY_CLUSTER = Cluster.uniform(2, 2, device_type="A", intra_node_bandwidth=5e9, inter_node_bandwidth=2e8)
"""2 nodes of 2 devices of type "A": fast links inside a node, slow between."""

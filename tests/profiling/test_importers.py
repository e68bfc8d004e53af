"""Importers: PipeDream graph.txt (linearised DAG) and AMP known_cost vectors, on inline samples and on the
shared reference data (skipped when ../shared is absent)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from hybridplan.errors import ProfileError
from hybridplan.profiling.importers import (
    amp_gpt2_layers,
    import_amp_known_cost,
    import_pipedream_graph,
    load_amp_gpt2,
    merge_device_types,
    read_pipedream_graph,
)
from tests.paths import SHARED

PIPEDREAM = SHARED / "data" / "pipedream"
AMP = SHARED / "data" / "amp"
needs_pipedream = pytest.mark.skipif(not PIPEDREAM.is_dir(), reason="../shared/data/pipedream is absent")
needs_amp = pytest.mark.skipif(not AMP.is_dir(), reason="../shared/data/amp is absent")

# A diamond with a skip: Input -> conv -> {left, right} -> add -> head, and conv -> add directly.
# node ids out of file order on purpose; "left" has a multi-output activation list.
DIAMOND = """\
node5 -- Add -- forward_compute_time=1.000, backward_compute_time=1.000, activation_size=400.0, parameter_size=0.000
node1 -- Input -- forward_compute_time=900.000, backward_compute_time=0.000, activation_size=100.0, parameter_size=0.000
node2 -- Conv2d(3, 8) -- forward_compute_time=10.000, backward_compute_time=20.000, activation_size=400.0, parameter_size=64.000
node3 -- Conv2d(8, 8) -- forward_compute_time=5.000, backward_compute_time=6.000, activation_size=[300.0; 100.0], parameter_size=32.000
node4 -- ReLU(inplace) -- forward_compute_time=1.000, backward_compute_time=1.000, activation_size=400.0, parameter_size=0.000
node6 -- Linear(8, 2) -- forward_compute_time=2.000, backward_compute_time=3.000, activation_size=8.0, parameter_size=16.000
\tnode1 -- node2
\tnode2 -- node3
\tnode2 -- node4
\tnode3 -- node5
\tnode4 -- node5
\tnode2 -- node5
\tnode5 -- node6
"""


def test_pipedream_diamond_linearised(tmp_path: Path) -> None:
    path = tmp_path / "diamond.graph.txt"
    path.write_text(DIAMOND)
    graph = read_pipedream_graph(path)
    assert graph.topological_order() == ("node1", "node2", "node3", "node4", "node5", "node6")
    p = import_pipedream_graph(path, batch_size=4)
    assert p.model == "diamond" and p.num_layers == 6
    # crossing bytes after each position, by hand:
    #  after Input: its output (100); after conv: conv out (400, read by 3, 4, 5);
    #  after node3: conv (still read by add) 400 + node3's 300+100 = 800;
    #  after node4: conv 400 + node3 400 + node4 400 = 1200; after add: 400; last: its own output 8.
    expected = np.array([100, 400, 800, 1200, 400, 8]) / 4
    np.testing.assert_allclose(p.activation_bytes(), expected)
    fwd, bwd = p.layer_times(p.reference_device_type, 1, 4)
    np.testing.assert_allclose(fwd, [0.0, 0.010, 0.005, 0.001, 0.001, 0.002])  # Input's data loading dropped
    np.testing.assert_allclose(bwd, [0.0, 0.020, 0.006, 0.001, 0.001, 0.003])
    assert [layer.parameter_bytes for layer in p.layers] == [0, 64, 32, 0, 0, 16]


@pytest.mark.parametrize(
    "text, match",
    [
        ("node1 -- Input -- forward_compute_time=1.0\n", "line 1 is neither a node nor an edge"),
        (DIAMOND + "\tnode6 -- node9\n", "names node 'node9', which has no node line"),
        (DIAMOND + "\tnode6 -- node2\n", "has a cycle"),
        (DIAMOND.replace("forward_compute_time=10.000", "forward_compute_time=-1"), "finite number >= 0"),
        (DIAMOND + DIAMOND.splitlines(keepends=True)[0], r"node id\(s\) \['node5'\] defined twice"),
        ("\n", "holds no nodes"),
    ],
)
def test_pipedream_malformed(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.graph.txt"
    path.write_text(text)
    with pytest.raises(ProfileError, match=match):
        import_pipedream_graph(path, batch_size=1)


def test_pipedream_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        import_pipedream_graph(tmp_path / "nope.txt", batch_size=1)
    (tmp_path / "d.txt").write_text(DIAMOND)
    with pytest.raises(ProfileError, match="batch_size must be a positive integer"):
        import_pipedream_graph(tmp_path / "d.txt", batch_size=0)


@needs_pipedream
def test_pipedream_shared_profiles_match_the_summary() -> None:
    """Every graph of the reference data: counts and totals as profiles_summary.csv (README test 1)."""
    rows = {r["model"]: r for r in csv.DictReader((PIPEDREAM / "profiles_summary.csv").open())}
    for path in sorted((PIPEDREAM / "profiles").glob("*.graph.txt")):
        model = path.name.removesuffix(".graph.txt")
        row = rows[model]
        graph = read_pipedream_graph(path)
        assert (len(graph.nodes), len(graph.edges)) == (int(row["nodes"]), int(row["edges"])), model
        p = import_pipedream_graph(path, batch_size=64)
        fwd, bwd = p.layer_times(p.reference_device_type, 1, 64)
        input_ms = sum(n.forward_ms for n in graph.nodes if n.is_input)
        assert fwd.sum() * 1e3 + input_ms == pytest.approx(float(row["sum_forward_ms"]), abs=1e-6), model
        assert bwd.sum() * 1e3 == pytest.approx(float(row["sum_backward_ms"]), abs=1e-6), model
        params_mib = sum(layer.parameter_bytes for layer in p.layers) / 2**20
        assert params_mib == pytest.approx(float(row["total_param_MB"]), abs=0.006), model
        order = graph.topological_order()
        pos = {n: i for i, n in enumerate(order)}
        assert all(pos[a] < pos[b] for a, b in graph.edges), model


@needs_pipedream
def test_pipedream_branches_cross_more_than_one_output() -> None:
    """ResNet-50's skip connections: some cuts ship two tensors, more than the node's own output."""
    path = PIPEDREAM / "profiles" / "resnet50.graph.txt"
    graph = read_pipedream_graph(path)
    order = graph.topological_order()
    own = np.array([{n.id: n.activation_bytes for n in graph.nodes}[i] for i in order])
    crossing = graph.boundary_bytes(order)
    assert np.any(crossing[:-1] > own[:-1])


def _amp_files(tmp_path: Path, n: int) -> dict[int, Path]:
    files = {}
    for tp in (1, 2):
        files[tp] = tmp_path / f"m_X_{tp}.npy"
        np.save(files[tp], np.arange(1, n + 1, dtype=float) / (1000 * tp))
    return files


def test_amp_import_inline(tmp_path: Path) -> None:
    layers = amp_gpt2_layers(num_layers=2, hidden=4, seq_len=3, vocab=10)
    assert [layer.name for layer in layers][:3] == ["embedding", "transpose bsh->sbh", "block0"] and len(layers) == 8
    assert layers[2].parameter_bytes == (12 * 16 + 13 * 4) * 4
    assert layers[2].tensor_parallel_allreduces == (2, 2)
    assert layers[0].shared_parameters == layers[-2].shared_parameters == "word_embeddings"
    p = import_amp_known_cost(_amp_files(tmp_path, 8), layers=layers, device_type="T4", model="tiny")
    assert p.tensor_comm_in_times and p.tensor_degrees("T4") == (1, 2)
    fwd, bwd = p.layer_times("T4", 2, 3)
    np.testing.assert_allclose(fwd, 3 * np.arange(1, 9) / 2000)
    np.testing.assert_allclose(bwd, 2 * fwd)


def test_amp_import_errors(tmp_path: Path) -> None:
    layers = amp_gpt2_layers(num_layers=2, hidden=4, seq_len=3, vocab=10)
    with pytest.raises(ProfileError, match="has 9 layer times but 8 layers"):
        import_amp_known_cost(_amp_files(tmp_path, 9), layers=layers, device_type="T4", model="m")
    with pytest.raises(ProfileError, match="does not exist"):
        import_amp_known_cost({1: tmp_path / "none.npy"}, layers=layers, device_type="T4", model="m")
    np.save(tmp_path / "twod.npy", np.zeros((2, 4)))
    with pytest.raises(ProfileError, match="1-D float vector"):
        import_amp_known_cost({1: tmp_path / "twod.npy"}, layers=layers, device_type="T4", model="m")
    (tmp_path / "junk.npy").write_text("not numpy")
    with pytest.raises(ProfileError, match="not a numeric .npy"):
        import_amp_known_cost({1: tmp_path / "junk.npy"}, layers=layers, device_type="T4", model="m")
    with pytest.raises(ProfileError, match="no gpt2_G4_<tp>.npy files"):
        load_amp_gpt2(tmp_path, "G4")
    with pytest.raises(ProfileError, match="unknown AMP instance"):
        load_amp_gpt2(tmp_path, "Z9")


@needs_amp
@pytest.mark.parametrize("instance, device", [("G4", "T4"), ("P3", "V100")])
def test_amp_shared_profiles(instance: str, device: str) -> None:
    p = load_amp_gpt2(AMP / "known_cost", instance)
    assert p.num_layers == 30 and p.tensor_degrees(device) == (1, 2, 4)
    expected = {
        (int(r["tp"]), int(r["layer_index"])): float(r["fwd_time_s_mbs1"])
        for r in csv.DictReader((AMP / "layer_profiles_fwd_mbs1.csv").open())
        if r["file"].startswith(f"gpt2_{instance}_")
    }
    for tp in (1, 2, 4):
        fwd, bwd = p.layer_times(device, tp, 1)
        np.testing.assert_allclose(fwd, [expected[(tp, i)] for i in range(30)])
        np.testing.assert_allclose(bwd, 2 * fwd)


# ---------------------------------------------------------------------------------------------- several device types
def test_amp_files_of_two_gpu_types_make_one_profile_and_time_a_mixed_cluster(tmp_path: Path) -> None:
    from dataclasses import replace

    from hybridplan.plan import Cluster, Plan
    from hybridplan.predict.time_model import predict_iteration_time

    layers = amp_gpt2_layers(num_layers=2, hidden=4, seq_len=3, vocab=10)
    t4 = {tp: tmp_path / f"m_G4_{tp}.npy" for tp in (1, 2)}
    v100 = {tp: tmp_path / f"m_P3_{tp}.npy" for tp in (1, 2)}
    for tp in (1, 2):
        np.save(t4[tp], np.arange(1, 9, dtype=float) / (1000 * tp))
        np.save(v100[tp], np.arange(1, 9, dtype=float) / (3000 * tp))  # a V100 a third of a T4's time here
    merged = merge_device_types([import_amp_known_cost(t4, layers=layers, device_type="T4", model="m"),
                                 import_amp_known_cost(v100, layers=layers, device_type="V100", model="m")])
    assert merged.device_types == ("T4", "V100") and merged.reference_device_type == "T4"
    assert merged.tensor_degrees("V100") == (1, 2) and merged.tensor_comm_in_times
    np.testing.assert_allclose(merged.layer_times("V100", 2, 1)[0], np.arange(1, 9) / 6000)
    np.testing.assert_allclose(merged.layer_times("T4", 1, 1)[1], 2 * np.arange(1, 9) / 1000)
    # a cluster of a T4 node and a V100 node: each stage runs on its own type's times (forward + 2 x forward)
    cluster = Cluster.from_dict({"nodes": 2, "devices_per_node": 1, "device": {"type": "T4"},
                                 "node_overrides": [{"nodes": [1], "type": "V100"}]})
    plan = Plan.uniform(boundaries=[0, 4, 8], data_degree=1, tensor_degree=1, micro_batch_size=1, global_batch_size=4)
    stages = predict_iteration_time(plan, merged, cluster).stages
    assert stages[0].compute_s == pytest.approx(3 * (1 + 2 + 3 + 4) / 1000)
    assert stages[1].compute_s == pytest.approx(3 * (5 + 6 + 7 + 8) / 3000)
    assert merge_device_types([merged]) is merged
    renamed = merge_device_types([import_amp_known_cost(t4, layers=layers, device_type="T4", model="m"),
                                  replace(merged, timings=merged.timings[2:])], model="gpt2-mixed")
    assert renamed.model == "gpt2-mixed" and renamed.device_types == ("T4", "V100")


def test_layer_time_files_of_two_device_types_merge(tmp_path: Path) -> None:
    from hybridplan.profiling.layer_info import LayerInfo
    from hybridplan.profiling.time_profile import TimeProfile
    from hybridplan.profiling.timing_table import TimingTable

    layers = (LayerInfo(name="a", activation_bytes_per_sample=4.0, parameter_bytes=8.0),
              LayerInfo(name="b", activation_bytes_per_sample=2.0, parameter_bytes=8.0))

    def on(device: str, seconds: float, comm: bool = False, layer_set: tuple[LayerInfo, ...] = layers) -> TimeProfile:
        n = len(layer_set)
        return TimeProfile(model="two", layers=layer_set, tensor_comm_in_times=comm, timings=(
            TimingTable(device_type=device, tensor_degree=1, micro_batch_size=2, forward_s=(seconds,) * n,
                        backward_s=(2 * seconds,) * n),))

    on("H100", 1.0).save(tmp_path / "h100.json")
    on("L4", 5.0).save(tmp_path / "l4.json")
    merged = merge_device_types([TimeProfile.load(tmp_path / "h100.json"), TimeProfile.load(tmp_path / "l4.json")])
    assert merged.device_types == ("H100", "L4")
    assert merged.layer_times("L4", 1, 4)[0].tolist() == [10.0, 10.0]  # 4 samples: twice the 2-sample time
    assert TimeProfile.from_dict(merged.to_dict()).device_types == ("H100", "L4")
    with pytest.raises(ProfileError, match=r"layer 1 differs between profile 0 and profile 1: name 'b' against 'c'"):
        merge_device_types([on("H100", 1.0), on("L4", 5.0, layer_set=(layers[0], LayerInfo(
            name="c", activation_bytes_per_sample=2.0, parameter_bytes=8.0)))])
    with pytest.raises(ProfileError, match="has 1 layers, profile 0"):
        merge_device_types([on("H100", 1.0), on("L4", 5.0, layer_set=layers[:1])])
    with pytest.raises(ProfileError, match="tensor_comm_in_times=True"):
        merge_device_types([on("H100", 1.0), on("L4", 5.0, comm=True)])
    with pytest.raises(ProfileError, match="device type 'H100', tensor degree 1, micro-batch size 2 is timed by profile 0"
                                           " and profile 1"):
        merge_device_types([on("H100", 1.0), on("H100", 2.0)])
    with pytest.raises(ProfileError, match="no time profiles"):
        merge_device_types([])


@needs_amp
def test_amp_shared_profiles_of_t4_and_v100_in_one() -> None:
    merged = merge_device_types([load_amp_gpt2(AMP / "known_cost", "G4"), load_amp_gpt2(AMP / "known_cost", "P3")])
    assert merged.device_types == ("T4", "V100") and merged.num_layers == 30
    rows = list(csv.DictReader((AMP / "layer_profiles_fwd_mbs1.csv").open()))
    for instance, device in (("G4", "T4"), ("P3", "V100")):
        expected = {(int(r["tp"]), int(r["layer_index"])): float(r["fwd_time_s_mbs1"])
                    for r in rows if r["file"].startswith(f"gpt2_{instance}_")}
        for tp in (1, 2, 4):
            np.testing.assert_allclose(merged.layer_times(device, tp, 1)[0], [expected[(tp, i)] for i in range(30)])

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

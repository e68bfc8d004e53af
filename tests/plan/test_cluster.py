import re

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import ClusterError


def test_shorthand():
    c = Cluster.parse("2x4")
    assert (c.num_nodes, c.devices_per_node, c.num_devices) == (2, 4, 8)
    assert [c.node_of(d) for d in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(c.devices_of_node(1)) == [4, 5, 6, 7]
    assert c.memory_of(3) is None


def test_shorthand_device_type_labels_the_devices():
    """A CUDA run's devices are "cuda" in its reports (the console said "1x1 cpu" on an H100)."""
    assert Cluster.parse("1x1", device_type="cuda").describe().startswith("1x1 cuda,")
    assert Cluster.parse("1x1").devices[0].type == "cpu"


def test_device_memory_override():
    c = Cluster.parse("1x2", device_memory="200MiB")
    assert c.memory_of(0) == c.memory_of(1) == 200 * 1024**2


def test_bandwidth_intra_inter():
    c = Cluster.uniform(2, 2, intra_node_bandwidth=100.0, inter_node_bandwidth=10.0)
    assert c.bandwidth(0, 1) == 100.0
    assert c.bandwidth(1, 2) == 10.0
    assert c.bandwidth(3, 3) == float("inf")


def test_toml_heterogeneous(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(
        """
nodes = 2
devices_per_node = 2
[device]
type = "A100"
memory = "40GiB"
[network]
intra_node = "600GB/s"
inter_node = "100Gbps"
[[node_overrides]]
nodes = [1]
type = "T4"
memory = "16GiB"
speed = 0.25
"""
    )
    c = Cluster.parse(str(f))
    assert [d.type for d in c.devices] == ["A100", "A100", "T4", "T4"]
    assert c.memory_of(0) == 40 * 1024**3 and c.memory_of(3) == 16 * 1024**3
    assert c.devices[2].speed == 0.25
    assert c.bandwidth(0, 1) == 600e9 and c.bandwidth(1, 2) == 100e9 / 8
    assert Cluster.from_dict(c.to_dict()) == c


def test_toml_matrix(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text('nodes = 1\ndevices_per_node = 2\n[network]\nmatrix = [[0, "10GB/s"], ["5GB/s", 0]]\n')
    c = Cluster.parse(str(f))
    assert c.bandwidth(0, 1) == 10e9 and c.bandwidth(1, 0) == 5e9


@pytest.mark.parametrize(
    "text, message",
    [
        ("nodes = 0\ndevices_per_node = 2\n", "positive integer"),
        ("nodes = 1\n", "missing required key 'devices_per_node'"),
        ("nodes = 1\ndevices_per_node = 2\ncolour = 'red'\n", "unknown key"),
        ("nodes = 1\ndevices_per_node = 2\n[device]\nmemory = 'lots'\n", "not a size"),
        ("nodes = 1\ndevices_per_node = 2\n[network]\nmatrix = [[0]]\n", "2x2"),
        ("nodes = [\n", "not valid TOML"),
        ("nodes = " + "[" * 100_000 + "]" * 100_000 + "\n", "nests arrays or tables too deeply"),
    ],
)
def test_toml_errors(tmp_path, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ClusterError, match=message):
        Cluster.parse(str(f))


def test_unknown_spec():
    with pytest.raises(ClusterError, match="NxK"):
        Cluster.parse("four gpus")


def test_missing_file():
    with pytest.raises(ClusterError, match="does not exist"):
        Cluster.parse("nowhere.toml")


MIXED_NODES = """
nodes = 3
devices_per_node = 2
[device]
type = "A100"
memory = "40GiB"
[network]
intra_node = "300GB/s"
inter_node = "100Gbps"
[[node_overrides]]
nodes = [1, 2]
type = "L4"
memory = "24GiB"
speed = 0.3
intra_node = "32GB/s"
"""


def test_toml_per_node_group_type_memory_speed_and_intra_node_bandwidth(tmp_path):
    # one NVLink node (300 GB/s inside) and two PCIe nodes (32 GB/s inside), 100 Gbps = 12.5 GB/s between nodes
    f = tmp_path / "mixed.toml"
    f.write_text(MIXED_NODES)
    c = Cluster.parse(str(f))
    assert [d.type for d in c.devices] == ["A100", "A100", "L4", "L4", "L4", "L4"]
    assert c.memory_of(0) == 40 * 2**30 and c.memory_of(5) == 24 * 2**30 and c.devices[3].speed == 0.3
    assert c.bandwidth(0, 1) == 300e9 and c.bandwidth(2, 3) == 32e9 and c.bandwidth(5, 4) == 32e9
    assert c.bandwidth(1, 2) == 12.5e9 and c.bandwidth(4, 0) == 12.5e9
    assert "32.00 GB/s" in c.describe() and "300.00 GB/s" in c.describe()
    assert Cluster.from_dict(c.to_dict()) == c


def test_a_toml_without_per_node_links_means_what_it_meant():
    # the same file with no intra_node override is the uniform cluster of before, field for field
    old = Cluster.from_dict({"nodes": 2, "devices_per_node": 2, "network": {"intra_node": 100.0, "inter_node": 10.0}})
    assert old == Cluster.uniform(2, 2, intra_node_bandwidth=100.0, inter_node_bandwidth=10.0)
    assert old.node_intra_bandwidths is None
    # an override that repeats the global link is no per-node link either
    same = Cluster.from_dict({"nodes": 2, "devices_per_node": 2, "network": {"intra_node": 100.0},
                              "node_overrides": [{"nodes": [1], "intra_node": 100.0}]})
    assert same.node_intra_bandwidths is None


@pytest.mark.parametrize("groups", [[0], [0, 1], [1, 2], [0, 3, 5], [2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [4, 4]])
def test_slowest_link_is_the_least_bandwidth_over_every_pair(tmp_path, groups):
    f = tmp_path / "mixed.toml"
    f.write_text(MIXED_NODES)
    c = Cluster.parse(str(f))
    pairs = [c.bandwidth(a, b) for a in groups for b in groups if a != b]
    assert c.slowest_link(groups) == (min(pairs) if pairs else float("inf"))
    matrix = Cluster.from_dict({"nodes": 1, "devices_per_node": 3, "network": {"matrix": [[0, 5, 7], [6, 0, 9], [8, 4, 0]]}})
    assert matrix.slowest_link([0, 2]) == 7 and matrix.slowest_link([1, 2]) == 4


@pytest.mark.parametrize(
    "override, message",
    [
        ('intra_node = "fast"', r"node_overrides\[0\]: intra_node 'fast' is not a bandwidth"),
        ("intra_node = 0", r"node_overrides\[0\]: intra_node must be positive"),
        ("intra_node = nan", r"node_overrides\[0\]: intra_node must be a positive bandwidth"),
        ('nodes = [3]\ntype = "T4"', r"'nodes' must be a list of node indices in \[0, 2\), got \[3\]"),
        ("nodes = [true]", r"'nodes' must be a list of node indices"),
        ('speed = "quick"', r"speed must be a positive number, got 'quick'"),
        ('colour = "red"', r"unknown key\(s\) \['colour'\]"),
    ],
)
def test_toml_per_node_errors_name_the_value(tmp_path, override, message):
    f = tmp_path / "bad.toml"
    body = override if override.startswith("nodes") else f"nodes = [1]\n{override}"
    f.write_text(f"nodes = 2\ndevices_per_node = 2\n[[node_overrides]]\n{body}\n")
    with pytest.raises(ClusterError, match=message):
        Cluster.parse(str(f))


def test_toml_matrix_and_per_node_link_contradict(tmp_path):
    f = tmp_path / "both.toml"
    f.write_text('nodes = 2\ndevices_per_node = 1\n[network]\nmatrix = [[0, 5], [5, 0]]\n'
                 '[[node_overrides]]\nnodes = [1]\nintra_node = "1GB/s"\n')
    with pytest.raises(ClusterError, match="matrix gives every link") as e:
        Cluster.parse(str(f))
    assert e.value.fix and "drop" in e.value.fix
    f.write_text("nodes = 2\ndevices_per_node = 1\nnode_overrides = 3\n")
    with pytest.raises(ClusterError, match="node_overrides must be a list of tables"):
        Cluster.parse(str(f))


def test_toml_link_latencies(tmp_path):
    (tmp_path / "c.toml").write_text('nodes = 2\ndevices_per_node = 2\n[network]\nintra_node_latency = "20us"\n'
                                     'inter_node_latency = 0.001\n')
    c = Cluster.parse(tmp_path / "c.toml")
    assert (c.latency(0, 1), c.latency(0, 2), c.latency(3, 3)) == (2e-05, 0.001, 0.0)
    assert Cluster.from_dict(c.to_dict()) == c and c.with_shape(1, 2).intra_node_latency == 2e-05
    # not given: None (the time profile's measured latency applies)
    assert Cluster.parse("2x2").latency(0, 2) is None


@pytest.mark.parametrize("value, message", [('"fast"', "network.intra_node_latency 'fast' is not a duration"),
                                            ("-1", "must be a finite number of seconds >= 0")])
def test_toml_bad_latency_is_named(tmp_path, value, message):
    (tmp_path / "c.toml").write_text(f"nodes = 1\ndevices_per_node = 2\n[network]\nintra_node_latency = {value}\n")
    with pytest.raises(ClusterError, match=re.escape(message)):
        Cluster.parse(tmp_path / "c.toml")


# ---------------------------------------------------------------------------------------------- GPUs of the catalogue
GIB = 2**30


def test_a_named_gpu_sets_the_type_the_memory_and_the_link_of_the_shorthand():
    """"2 nodes of 8 H100 SXM": cuda devices of 80 GiB, NVLink 4 within a node (900 GB/s both ways: 450 one way)."""
    c = Cluster.parse("2x8", gpu="h100-sxm")
    assert {(d.type, d.gpu, d.memory_bytes) for d in c.devices} == {("cuda", "h100-sxm", 80 * GIB)}
    assert c.bandwidth(0, 1) == 450e9 and c.bandwidth(0, 8) == 12.5e9  # inter-node: the default 100 Gbps
    assert c.gpu_of(3).name == "NVIDIA H100 SXM5 80GB"
    assert c.describe().startswith("2x8 cuda h100-sxm, 80.00 GiB per device, intra 450.00 GB/s")
    assert Cluster.parse("1x2").gpu_of(0) is None


def test_device_memory_wins_over_the_gpus_and_cpu_devices_cannot_be_gpus():
    assert Cluster.parse("1x2", gpu="a100-80gb", device_memory="70GiB").memory_of(1) == 70 * GIB
    with pytest.raises(ClusterError, match="'cpu'"):
        Cluster.parse("1x2", gpu="t4", device_type="cpu")
    with pytest.raises(ClusterError, match="unknown GPU 'x100'"):
        Cluster.parse("1x2", gpu="x100")


def test_reshaping_keeps_the_gpu():
    assert Cluster.parse("2x8", gpu="l4").with_shape(1, 4).devices[0].gpu == "l4"


def test_toml_gpu_per_node(tmp_path):
    """[device] names the A100 40GB; node 1 is of T4s, whose PCIe Gen3 x16 link (15.75 GB/s one way) it takes."""
    f = tmp_path / "c.toml"
    f.write_text('nodes = 3\ndevices_per_node = 2\n[device]\ngpu = "a100-40gb"\n'
                 '[[node_overrides]]\nnodes = [1]\ngpu = "T4"\n'
                 '[[node_overrides]]\nnodes = [2]\nmemory = "30GiB"\n')
    c = Cluster.parse(f)
    assert [(d.type, d.gpu, d.memory_bytes // GIB) for d in c.devices[::2]] == [
        ("cuda", "a100-40gb", 40), ("cuda", "t4", 16), ("cuda", "a100-40gb", 30)]  # node 2 keeps [device]'s GPU
    assert [c.bandwidth(2 * n, 2 * n + 1) for n in range(3)] == [300e9, pytest.approx(15.75e9, rel=1e-3), 300e9]
    assert Cluster.from_dict(c.to_dict()) == c


def test_toml_gpu_gives_way_to_what_the_file_says(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('nodes = 1\ndevices_per_node = 2\n[device]\ngpu = "h100-sxm"\ntype = "H100"\nmemory = "79GiB"\n'
                 '[network]\nintra_node = "100GB/s"\n')
    c = Cluster.parse(f)
    assert (c.devices[0].type, c.devices[0].gpu, c.memory_of(0), c.bandwidth(0, 1)) == ("H100", "h100-sxm", 79 * GIB, 100e9)


@pytest.mark.parametrize("value, message", [('"b200"', "unknown GPU 'b200'"), ("80", "gpu must be the name of a GPU")])
def test_toml_bad_gpu_is_named(tmp_path, value, message):
    f = tmp_path / "c.toml"
    f.write_text(f"nodes = 1\ndevices_per_node = 1\n[device]\ngpu = {value}\n")
    with pytest.raises(ClusterError, match=re.escape(message)) as e:
        Cluster.parse(f)
    assert "[device]" in e.value.message and "h100-sxm" in (e.value.fix or "")

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

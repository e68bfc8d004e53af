import pytest

from hybridplan.errors import UsageError
from hybridplan.units import format_bytes, parse_bandwidth, parse_bytes


@pytest.mark.parametrize(
    "text, expected",
    [("200MiB", 200 * 1024**2), ("40GB", 40 * 10**9), ("1.5GiB", 3 * 1024**3 // 2), ("512", 512), ("2 KiB", 2048), (4096, 4096)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "12XB", "-5MiB", "", True])
def test_parse_bytes_rejects_with_fix(text):
    with pytest.raises(UsageError) as err:
        parse_bytes(text, what="--device-memory")
    assert "--device-memory" in str(err.value) or "size" in str(err.value)


@pytest.mark.parametrize(
    "text, expected",
    [("100Gbps", 100e9 / 8), ("100Gb/s", 100e9 / 8), ("25GB/s", 25e9), ("25GBps", 25e9), (5e9, 5e9), ("800MB/s", 800e6)],
)
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


def test_parse_bandwidth_rejects():
    with pytest.raises(UsageError, match="not a bandwidth"):
        parse_bandwidth("fast")
    with pytest.raises(UsageError, match="not a finite bandwidth"):
        parse_bandwidth("1e400GB/s")


@pytest.mark.parametrize("text", ["1e300TB", "1e16MB", 1e300, float("inf"), "1e400B"])
def test_parse_bytes_refuses_absurd_sizes(text):
    """Above 1 PiB (issue 32: 1e300TB was an OverflowError traceback)."""
    with pytest.raises(UsageError, match=r"--device-memory .* is more than 1,125,899,906,842,624 bytes \(1 PiB\)") as err:
        parse_bytes(text, what="--device-memory")
    assert err.value.fix
    assert parse_bytes("1024TiB") == 2**50  # the bound itself is a size


def test_format_bytes():
    assert format_bytes(1024**2 * 3) == "3.00 MiB"
    assert format_bytes(100) == "100 B"
    assert format_bytes(None) == "-"


def test_parse_seconds():
    from hybridplan.units import parse_seconds

    assert [parse_seconds(x) for x in ("20us", "0.3ms", "2s", "500ns", 0.25)] == [2e-5, 3e-4, 2.0, 5e-7, 0.25]
    for bad in ("soon", "5 parsecs", -1.0, True, float("inf")):
        with pytest.raises(UsageError):
            parse_seconds(bad)  # type: ignore[arg-type]

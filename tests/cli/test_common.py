"""The checks every command makes before its work: argument types, output paths, and keeping a finished result."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from hybridplan.cli.common import (add_cluster, add_training, check_output, cluster_from, global_batch, microbatches, positive_float,
                                   positive_int, write_output)
from hybridplan.errors import UsageError


@pytest.mark.parametrize("text", ["0", "-3", "x", "1.5", ""])
def test_positive_int_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be a positive integer"):
        positive_int(text)


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "ten"])
def test_positive_float_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be a positive number"):
        positive_float(text)


def test_positive_values_pass():
    assert positive_int("7") == 7 and positive_float("0.5") == 0.5


@pytest.mark.parametrize("text, message", [
    (str(10**21), r"must be at most 16,777,216: 256 times .*; got 1,000,000,000,000,000,000,000"),
    ("9" * 5000, r"must be at most 16,777,216: .*; got an integer of 5,000 digits"),
    ("0", "must be a positive integer"),
])
def test_global_batch_is_bounded(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        global_batch(text)
    assert global_batch(str(2**24)) == 2**24


def test_microbatches_are_bounded():
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at most 65,536: .*; got 1,099,511,627,776"):
        microbatches(str(2**40))
    assert microbatches("65536") == 65536


def test_check_output_accepts_a_new_file_and_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    check_output(target, "--out")
    assert not target.exists()


def test_check_output_keeps_an_existing_file(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    check_output(target, "--out")
    assert target.read_text() == "old"


@pytest.mark.parametrize("make, message", [
    (lambda d: d, "is a directory"),
    (lambda d: d / "missing" / "out.json", "cannot be written"),
    (lambda d: Path("/proc/hybridplan-test.json"), "cannot be written"),  # read-only even for root
])
def test_check_output_refuses(tmp_path, make, message):
    with pytest.raises(UsageError, match=message):
        check_output(make(tmp_path), "--out")


def test_a_result_that_cannot_be_written_is_kept_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with pytest.raises(UsageError) as e:
        write_output(tmp_path / "gone" / "result.json", '{"status": "ok"}\n', "--out")
    kept = [p for p in tmp_path.iterdir() if p.name.endswith("result.json")]
    assert len(kept) == 1 and kept[0].read_text() == '{"status": "ok"}\n'
    assert str(kept[0]) in str(e.value) and "--out" in str(e.value)


def test_write_output_replaces_atomically(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    write_output(target, "new", "--out")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize("argv, device", [([], "cpu"), (["--device", "cuda"], "cuda")])
def test_the_cluster_of_a_command_has_its_device_type(argv, device):
    """What labels a run's devices and ``profile --time``'s layer times: the --device of the command."""
    p = argparse.ArgumentParser()
    add_cluster(p)
    add_training(p)
    cluster = cluster_from(p.parse_args(["--cluster", "1x2", *argv]))
    assert [d.type for d in cluster.devices] == [device, device]

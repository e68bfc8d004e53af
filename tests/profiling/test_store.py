"""The profile database file (profiling/store.py): what is written reads back, a run and its measurements are stored
together or not at all, reading never changes the file, and what is not a profile database is refused with a
:class:`ProfileError`."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from hybridplan.errors import ProfileError
from hybridplan.profiling.quantities import QUANTITIES
from hybridplan.profiling.store import FORMAT_VERSION, ProfileStore

TIMELINE = [{"action": "F0", "before": 0, "peak": 5, "after": 3}]


def _measurement(device: int, kind: str = "none", degree: int = 1, batch: int = 8) -> dict:
    return {"device": device, "stage": device, "start": device, "stop": device + 1, "kind": kind, "degree": degree,
            "batch_size": batch, "microbatch_size": batch // 2, "peak": 100 + device,
            "quantities": [10 * device + i for i in range(len(QUANTITIES))], "timeline": TIMELINE}


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _foreign(path):
    """A SQLite database of another program: one table of its own, no 'meta'."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (text TEXT)")
    db.execute("INSERT INTO notes VALUES ('mine')")
    db.commit()
    db.close()
    return path


def test_settings_read_back_as_written_and_the_format_is_recorded(tmp_path):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        store.set_meta("batch_sizes", [16, 8])
        store.set_meta("identity", {"model": "m", "seed": 0})
        store.set_meta("batch_sizes", [32, 16])  # replaced, not added
    with ProfileStore(tmp_path / "p.sqlite", create=False) as store:
        assert store.meta() == {"format_version": FORMAT_VERSION, "batch_sizes": [32, 16], "identity": {"model": "m", "seed": 0}}
        assert store.get_meta("missing") is None


def test_runs_and_their_measurements_read_back_filtered(tmp_path):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        ok = store.record_run(key="a", scenario="pipeline", batch_size=8, plan={"p": 1}, status="ok", reason=None,
                              wall_seconds=1.5, measurements=[_measurement(0), _measurement(1, "tensor", 2)])
        failed = store.record_run(key="b", scenario="tensor2", batch_size=4, plan={"p": 2}, status="oom", reason="x",
                                  wall_seconds=None)
        assert [r.key for r in store.runs()] == ["a", "b"] and failed > ok
        run = store.find_run("b")
        assert (run.id, run.scenario, run.batch_size, run.plan, run.status, run.reason) == (failed, "tensor2", 4, {"p": 2}, "oom", "x")
        assert store.find_run("c") is None
        every = store.measurements()
        assert [(m.run_id, m.device, m.kind, m.degree, m.peak) for m in every] == [(ok, 0, "none", 1, 100), (ok, 1, "tensor", 2, 101)]
        assert list(every[1].quantities) == [10 + i for i in range(len(QUANTITIES))]
        assert [m.device for m in store.measurements(kind="tensor", degree=2)] == [1]
        assert store.measurements(batch_size=4) == []


def test_reserved_peaks_read_back_with_their_measurements_span(tmp_path):
    """A CUDA run's (tensor peak, reserved peak) per device come back with the span and scenario they measured; a
    device without them (a CPU run) has no row."""
    with ProfileStore(tmp_path / "p.sqlite") as store:
        cuda = [{**_measurement(0), "reserved": (3000, 2097152)}, {**_measurement(1, "tensor", 2), "reserved": (5, 4194304)},
                {**_measurement(2), "reserved": None}]
        store.record_run(key="a", scenario="pipeline", batch_size=8, plan={}, status="ok", reason=None,
                         wall_seconds=1.0, measurements=cuda)
        assert store.reserved_peaks() == [("none", 1, 8, 4, 0, 1, 3000, 2097152), ("tensor", 2, 8, 4, 1, 2, 5, 4194304)]


def test_a_run_whose_measurements_cannot_be_stored_is_not_stored(tmp_path):
    bad = _measurement(0)
    del bad["peak"]
    with ProfileStore(tmp_path / "p.sqlite") as store:
        with pytest.raises(KeyError):
            store.record_run(key="a", scenario="pipeline", batch_size=8, plan={}, status="ok", reason=None,
                             wall_seconds=1.0, measurements=[_measurement(1), bad])
        assert store.runs() == [] and store.measurements() == []  # the whole transaction was rolled back


def test_statistics_stash_and_layer_times_are_replaced_per_key(tmp_path):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        store.replace_statistics("pipeline", 8, [(0, "M_i", "static", 1.0), (1, "M_a", "static", 2.0)])
        store.replace_statistics("pipeline", 8, [(0, "M_i", "static", 3.0)])
        store.replace_statistics("pipeline", 4, [(0, "M_i", "static", 4.0)])
        assert store.statistics_rows() == [("pipeline", 4, 0, "M_i", "static", 4.0), ("pipeline", 8, 0, "M_i", "static", 3.0)]
        store.replace_weight_stash("none", 1, [100, None, 300])  # layer 1 cannot run so: no row
        store.replace_weight_stash("tensor", 2, [50, 60, 70])
        store.replace_weight_stash("tensor", 2, [55, 65, 75])
        assert store.weight_stash() == {("none", 1): {0: 100, 2: 300}, ("tensor", 2): {0: 55, 1: 65, 2: 75}}
        store.record_layer_times("cpu", 1, 4, [(0, 0.1, 0.2, 5), (1, 0.3, 0.4, 5)])
        store.record_layer_times("cpu", 1, 4, [(1, 0.5, 0.6, 7)])
        assert store.layer_times() == {("cpu", 1, 4): {0: (0.1, 0.2, 5), 1: (0.5, 0.6, 7)}}
        store.record_run_costs("cpu", 1, 4, 0, 2, 1000.0, 0.5, 0.25)
        store.record_run_costs("cpu", 1, 4, 0, 2, 1000.0, 0.75, 0.5)
        store.record_run_costs("cpu", 1, 4, 2, 3, 10.0, 0.1, 0.2)
        assert store.run_costs() == {("cpu", 1, 4): [(0, 2, 1000.0, 0.75, 0.5), (2, 3, 10.0, 0.1, 0.2)]}


def test_opening_read_only_never_changes_the_file(tmp_path):
    path = tmp_path / "p.sqlite"
    with ProfileStore(path) as store:
        store.set_meta("model", "m")
        store.record_run(key="a", scenario="pipeline", batch_size=8, plan={}, status="ok", reason=None,
                         wall_seconds=1.0, measurements=[_measurement(0)])
    before, files = _digest(path), sorted(p.name for p in tmp_path.iterdir())
    with ProfileStore(path, create=False) as store:
        read = (store.meta(), store.runs(), store.measurements(), store.weight_stash(), store.layer_times(),
                store.statistics_rows())
    assert read[0]["model"] == "m" and len(read[2]) == 1
    assert _digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == files


def test_an_older_database_without_the_later_tables_reads_as_empty(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('format_version', ?)", (json.dumps(FORMAT_VERSION),))
    db.commit()
    db.close()
    with ProfileStore(path, create=False) as store:
        assert (store.runs(), store.find_run("a"), store.measurements(), store.weight_stash(), store.layer_times(),
                store.statistics_rows(), store.run_costs(), store.reserved_peaks()) == ([], None, [], {}, {}, [], {}, [])


@pytest.mark.parametrize("create", [False, True])
def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path, create):
    path = tmp_path / "notes.sqlite"
    path.write_text("hello, not a database\n" * 50)
    with pytest.raises(ProfileError, match="is not a hybridplan profile database"):
        ProfileStore(path, create=create)
    assert path.read_text() == "hello, not a database\n" * 50


def test_another_programs_database_is_refused_read_only_and_left_alone(tmp_path):
    path = _foreign(tmp_path / "other.sqlite")
    before = _digest(path)
    with pytest.raises(ProfileError, match="it has no 'meta' table"):
        ProfileStore(path, create=False)
    assert _digest(path) == before


def test_another_programs_database_is_refused_for_writing_and_left_alone(tmp_path):
    path = _foreign(tmp_path / "other.sqlite")
    before = _digest(path)
    with pytest.raises(ProfileError, match="is not a hybridplan profile database"):
        ProfileStore(path).close()
    assert _digest(path) == before


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_a_path_that_is_no_file_is_refused_read_only(tmp_path, where):
    path = tmp_path / "p.sqlite"
    if where == "directory":
        path.mkdir()
    with pytest.raises(ProfileError, match="does not exist" if where == "missing" else "is a directory"):
        ProfileStore(path, create=False)
    assert (not path.exists()) if where == "missing" else path.is_dir()


def _damage(path, key: str, text: str) -> None:
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = ? WHERE key = ?", (text, key))
    db.commit()
    db.close()


def test_a_damaged_setting_is_a_profile_error_naming_it(tmp_path):
    path = tmp_path / "p.sqlite"
    with ProfileStore(path) as store:
        store.set_meta("model", "m")
    _damage(path, "model", "{not json")
    with ProfileStore(path, create=False) as store:
        with pytest.raises(ProfileError, match="meta value 'model' is not JSON"):
            store.get_meta("model")
        with pytest.raises(ProfileError, match="meta value 'model' is not JSON"):
            store.meta()


@pytest.mark.parametrize("create", [False, True])
def test_a_damaged_or_newer_format_is_refused_on_opening(tmp_path, create):
    path = tmp_path / "p.sqlite"
    ProfileStore(path).close()
    _damage(path, "format_version", "one")
    with pytest.raises(ProfileError, match="meta value 'format_version' is not JSON"):
        ProfileStore(path, create=create)
    _damage(path, "format_version", json.dumps(FORMAT_VERSION + 1))
    with pytest.raises(ProfileError, match=f"has profile format {FORMAT_VERSION + 1}, this hybridplan reads {FORMAT_VERSION}"):
        ProfileStore(path, create=create)

"""A profile database as its readers see it (profiling/database.py): one read-only connection that never changes
the file, each part read when first asked for, and a :class:`ProfileError` for what is not a profile.

The profile is a copy of the MLP's memory profile of ``mlp_files`` (tests/conftest.py: 1x4, pipeline and tensor x2
statistics on simulated devices, no layer times)."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3

import pytest

from hybridplan.errors import ProfileError
from hybridplan.profiling.database import ProfileDB
from hybridplan.profiling.store import ProfileStore
from tests.cli.conftest import MLP


@pytest.fixture
def db(mlp_files, tmp_path):
    return shutil.copy(mlp_files / "p.sqlite", tmp_path / "p.sqlite")


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_what_the_campaign_recorded(db):
    with ProfileDB(db) as profile:
        assert profile.model == MLP and profile.identity["model"] == MLP
        assert profile.run_options["backend"] == "sim" and profile.merge_groups is None
        assert profile.has_memory and not profile.has_layer_times
        profile.require_memory()
        assert set(profile.statistics) == {("none", 1), ("tensor", 2)}
        assert {key: sorted(layers) for key, layers in profile.weight_stash.items()} == {
            ("none", 1): [0, 1, 2, 3, 4], ("tensor", 2): [0, 1, 2, 3, 4]}  # every layer of the MLP splits at x2
        with pytest.raises(ProfileError):
            profile.time_profile()  # a memory campaign only


def test_reading_everything_never_changes_the_file(db, tmp_path):
    before, files = _digest(db), sorted(p.name for p in tmp_path.iterdir())
    with ProfileDB(db) as profile:
        _ = (profile.meta, profile.statistics, profile.weight_stash, profile.has_layer_times)
        with pytest.raises(ProfileError):
            profile.time_profile()
    assert _digest(db) == before and sorted(p.name for p in tmp_path.iterdir()) == files


def test_a_file_without_a_campaign_is_refused_when_memory_is_needed(tmp_path):
    ProfileStore(tmp_path / "empty.sqlite").close()
    with ProfileDB(tmp_path / "empty.sqlite") as profile:
        assert not profile.has_memory and profile.identity == {} and profile.model is None
        with pytest.raises(ProfileError, match="holds no finished profiling campaign"):
            profile.require_memory()


def test_what_is_not_a_profile_is_refused(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        ProfileDB(tmp_path / "missing.sqlite")
    (tmp_path / "text.sqlite").write_text("not a database\n" * 50)
    with pytest.raises(ProfileError, match="is not a hybridplan profile database"):
        ProfileDB(tmp_path / "text.sqlite")
    other = sqlite3.connect(tmp_path / "other.sqlite")
    other.execute("CREATE TABLE notes (text TEXT)")
    other.commit()
    other.close()
    before = _digest(tmp_path / "other.sqlite")
    with pytest.raises(ProfileError, match="it has no 'meta' table"):
        ProfileDB(tmp_path / "other.sqlite")
    assert _digest(tmp_path / "other.sqlite") == before


def test_a_damaged_setting_is_a_profile_error(db):
    raw = sqlite3.connect(db)
    raw.execute("UPDATE meta SET value = '{damaged' WHERE key = 'identity'")
    raw.commit()
    raw.close()
    with ProfileDB(db) as profile:
        with pytest.raises(ProfileError, match="meta value 'identity' is not JSON"):
            profile.identity

"""The memo of simulated stages: a campaign served from it writes what a campaign that simulated every stage writes;
a changed model misses it; a damaged entry is simulated again, never trusted; concurrent writers leave it whole."""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridplan.plan import Cluster
from hybridplan.profiling.campaign import Campaign, CampaignConfig
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.stage_memo import StageMemo
from hybridplan.profiling.store import ProfileStore
from hybridplan.predict.memory import MemoryPredictor
from tests.profiling.memo_writer import write

pytest.importorskip("transformers")


class _NeverRemembers(StageMemo):
    """A memo that never answers: every stage is simulated, as before the memo existed."""

    def get(self, identity: dict[str, Any]) -> dict[str, Any] | None:
        self.misses += 1
        return None


class _Recording(StageMemo):
    """A memo that records the key of every entry it answered with."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.answered: set[str] = set()

    def get(self, identity: dict[str, Any]) -> dict[str, Any] | None:
        value = super().get(identity)
        if value is not None:
            self.answered.add(self.key_of(identity))
        return value


_DECODERS = 4
"""Decoder layers of the test model: fewer layers, fewer partitionings to simulate twice (the check is the same)."""


def _llama(folder: Path, **changes: int) -> str:
    """``hf:llama-tiny`` with 4 decoder layers (6 layers: repeats to share, in the first, middle and last stages of
    4 devices), and ``changes``, as a config file."""
    from hybridplan.models.hf_config import load_hf_config

    config = {**load_hf_config("hf:llama-tiny"), "num_hidden_layers": _DECODERS, **changes}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return f"hf:{folder}"


_BOTH = (Scenario("none", 1), Scenario("tensor", 2))


def _campaign(db: Path, memo: StageMemo, model: str, neighbors: int | None = 1,
              scenarios: tuple[Scenario, ...] = _BOTH) -> Campaign:
    cfg = CampaignConfig(model=model, cluster=Cluster.uniform(1, 4), global_batch_size=8, num_microbatches=2,
                         scenarios=scenarios, neighbors=neighbors, run_options={"backend": "sim"})
    return Campaign(cfg, ProfileStore(db), memo=memo)


def _content(db: Path) -> tuple[list[Any], ...]:
    """Every measurement (peak at index 9), statistic and meta entry of a profile database."""
    con = sqlite3.connect(db)
    try:
        return tuple(con.execute(q).fetchall() for q in (
            "SELECT * FROM measurements ORDER BY run_id, device", "SELECT * FROM statistics ORDER BY 1, 2, 3, 4, 5",
            "SELECT * FROM meta ORDER BY key", "SELECT key, scenario, batch_size, plan, status FROM runs ORDER BY id"))
    finally:
        con.close()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The test model (:func:`_llama`), written once for the module's campaigns."""
    return _llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def served(llama: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, StageMemo]:
    """Both scenarios with ``neighbors=1``, served by a memo that started empty: the database written, the memo's
    folder (tests that add to it copy it first) and the memo. One campaign for the tests below that read it."""
    folder = tmp_path_factory.mktemp("served")
    memo = StageMemo(folder / "stages")
    _campaign(folder / "memo.sqlite", memo, llama).run()
    return folder / "memo.sqlite", folder / "stages", memo


def _copy_of_stages(served: tuple[Path, Path, StageMemo], tmp_path: Path) -> Path:
    return Path(shutil.copytree(served[1], tmp_path / "stages"))


@pytest.mark.parametrize("neighbors", [1, None])
def test_a_campaign_served_by_the_memo_writes_what_simulating_everything_writes(
        tmp_path: Path, neighbors: int | None, llama: str, served: tuple[Path, Path, StageMemo]) -> None:
    """neighbors=1: the memo starts empty (``served``); neighbors=None (more partitionings): it starts with what the
    first campaign wrote, and simulates the partitionings that one did not."""
    full = tmp_path / "full.sqlite"
    never = _NeverRemembers()
    _campaign(full, never, llama, neighbors).run()
    if neighbors == 1:
        memo_db, memo = served[0], served[2]
    else:
        memo_db, memo = tmp_path / "memo.sqlite", StageMemo(_copy_of_stages(served, tmp_path))
        _campaign(memo_db, memo, llama, neighbors).run()
    assert memo.hits > 0 and memo.misses < never.misses  # the decoder layers are one layer: simulated once a place
    assert _content(memo_db) == _content(full)
    a, b = MemoryPredictor.from_db(full), MemoryPredictor.from_db(memo_db)
    layers = _DECODERS + 2  # the embedding, the decoders, the head
    for kind, degree in (("none", 1), ("tensor", 2)):
        for after in (0, 1, 2):
            assert np.array_equal(a.stage_memory_matrix(kind, degree, after, layers), b.stage_memory_matrix(kind, degree, after, layers))


def test_a_second_campaign_reads_every_stage_from_the_disk(tmp_path: Path, llama: str,
                                                           served: tuple[Path, Path, StageMemo]) -> None:
    again = StageMemo(_copy_of_stages(served, tmp_path))
    _campaign(tmp_path / "b.sqlite", again, llama).run()
    assert again.misses == 0 and again.hits > 0
    assert _content(served[0]) == _content(tmp_path / "b.sqlite")


def test_a_changed_config_misses_the_memo(tmp_path: Path, served: tuple[Path, Path, StageMemo]) -> None:
    stages = _copy_of_stages(served, tmp_path)
    first = {p.stem for p in stages.glob("*.json")}  # the first model's entries, by key
    assert first
    wider = _llama(tmp_path / "wider", intermediate_size=72)
    other = _Recording(stages)
    _campaign(tmp_path / "b.sqlite", other, wider).run()
    assert other.misses > 0 and not other.answered & first  # nothing of the first model's was taken
    a, b = _content(served[0])[0], _content(tmp_path / "b.sqlite")[0]
    assert len(a) == len(b) and [r[9] for r in a] != [r[9] for r in b]  # and it measures other bytes


def _entry(tmp_path: Path) -> tuple[StageMemo, dict[str, Any], Path]:
    memo = StageMemo(tmp_path)
    identity = {"span": ["x"], "stage": 1}
    memo.put(identity, {"static": 10, "timeline": [1, 2]})
    return memo, identity, tmp_path / f"{StageMemo.key_of(identity)}.json"


@pytest.mark.parametrize("damage", ["truncated", "value changed", "other key", "not json"])
def test_a_damaged_entry_is_rebuilt_not_trusted(tmp_path: Path, damage: str) -> None:
    _, identity, path = _entry(tmp_path)
    entry = json.loads(path.read_text())
    if damage == "truncated":
        path.write_text(path.read_text()[:20])
    elif damage == "value changed":
        entry["value"]["static"] = 11
        path.write_text(json.dumps(entry))
    elif damage == "other key":
        entry["key"] = {"span": ["y"], "stage": 1}
        path.write_text(json.dumps(entry))
    else:
        path.write_bytes(b"\x00\xff" * 10)
    fresh = StageMemo(tmp_path)
    assert fresh.get(identity) is None
    assert fresh.rebuilt == 1 and not path.exists()
    fresh.put(identity, {"static": 12})
    assert StageMemo(tmp_path).get(identity) == {"static": 12}


def test_concurrent_writers_leave_every_entry_whole(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=write, args=(str(tmp_path), w)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    memo = StageMemo(tmp_path)
    for i in range(10):
        assert memo.get({"shared": i}) == {"value": i, "pad": "x" * 2000}
    for w in range(4):
        for i in range(60):
            assert memo.get({"own": w, "i": i}) == {"value": i}
    assert memo.rebuilt == 0 and not list(tmp_path.glob(".*.tmp"))


def test_an_unwritable_cache_works_in_memory_and_says_so(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    lines: list[str] = []
    memo = StageMemo(blocker / "cache", on_unusable=lines.append)
    assert memo.directory is None and len(lines) == 1 and "cannot be written" in lines[0]
    memo.put({"k": 1}, {"v": 2})
    assert memo.get({"k": 1}) == {"v": 2}

"""profiling/auxiliary_tables.py: the tables a profile records on fake tensors, by hand on the MLP (Linear(16, 32),
ReLU, Linear(32, 32), ReLU, Linear(32, 10)), once per database, and left out, with a line, where they cannot be
computed."""

from __future__ import annotations

import pytest

from hybridplan.models.zoo import resolve_model
from hybridplan.profiling.auxiliary_tables import record_auxiliary_tables
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.store import ProfileStore

MLP = "tests.cli.user_models:mlp"
SCENARIOS = [Scenario("none", 1), Scenario("data", 2), Scenario("tensor", 2)]


def test_the_mlp_tables_by_hand(tmp_path):
    said: list[str] = []
    with ProfileStore(tmp_path / "p.sqlite") as store:
        record_auxiliary_tables(store, resolve_model(MLP), SCENARIOS, {"backend": "sim"}, said.append)
        # fp32 stash: every parameter once, 4 bytes an element ((16 x 32 + 32), (32 x 32 + 32), (32 x 10 + 10));
        # a tensor x2 rank stashes its half (each Linear split by its output features); data stages stash as "none"
        assert store.weight_stash() == {("none", 1): {0: 4 * 544, 1: 0, 2: 4 * 1056, 3: 0, 4: 4 * 330},
                                        ("tensor", 2): {0: 4 * 272, 1: 0, 2: 4 * 528, 3: 0, 4: 4 * 165}}
        assert store.get_meta("tensor_shard_shapes") == {
            "2": [[[4, 16, 16], [4, 16]], [], [[4, 16, 32], [4, 16]], [], [[4, 5, 32], [4, 5]]]}
        # cross-entropy's backward over 10 classes holds twice the float32 logits: 80 bytes a sample
        assert store.get_meta("loss_backward_transient") == {"samples": [1, 2], "bytes": [80, 160]}
        # the head unsplit: its weight's and bias's gradients (32 x 10 + 10 floats) with its input's (32 a sample)
        heads = store.get_meta("head_backward_transient")
        assert heads["1"] == {"samples": [1, 2, 4, 8, 16, 32], "bytes": [1320 + 128 * n for n in (1, 2, 4, 8, 16, 32)],
                              "recompute": False, "input_bytes": 128}
        assert set(heads) == {"1", "2"}  # and split as a tensor x2 rank splits it
    assert said == []


def _fail(*args: object, **kwargs: object) -> None:
    raise RuntimeError("no fake tensors for this model")


def _break_every_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hybridplan.profiling.stash_sizes.layer_stash_bytes", _fail)
    monkeypatch.setattr("hybridplan.runtime.split_layers.layer_shard_shapes", _fail)
    monkeypatch.setattr("hybridplan.profiling.loss_memory.loss_backward_bytes", _fail)
    monkeypatch.setattr("hybridplan.profiling.loss_memory.head_backward_bytes", _fail)


def test_a_table_that_cannot_be_computed_is_left_out_saying_what_it_costs(tmp_path, monkeypatch):
    _break_every_table(monkeypatch)
    said: list[str] = []
    with ProfileStore(tmp_path / "p.sqlite") as store:
        record_auxiliary_tables(store, resolve_model(MLP), SCENARIOS, {"backend": "sim"}, said.append)
        assert store.weight_stash() == {}
        assert store.get_meta("tensor_shard_shapes") == {}  # no degree recorded (tried again on resume)
        assert store.get_meta("loss_backward_transient") is None
        assert store.get_meta("head_backward_transient") == {}  # no degree recorded (tried again on resume)
    assert len(said) == 6  # the stash of none x1 and tensor x2, the shards of tensor x2, the loss, the head x1 and x2
    assert all("RuntimeError: no fake tensors for this model" in line for line in said)
    assert "2bw plans" in said[0] and "ZeRO-1 of data x tensor" in said[2] and "batch scaling alone" in said[3]
    assert "take the loss's phase for the head's" in said[4] and "tensor x2" in said[5]


def test_tables_are_computed_once_per_database(tmp_path, monkeypatch):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        record_auxiliary_tables(store, resolve_model(MLP), SCENARIOS, {"backend": "sim"}, lambda line: None)
        before = (store.weight_stash(), store.get_meta("tensor_shard_shapes"), store.get_meta("loss_backward_transient"),
                  store.get_meta("head_backward_transient"))
        _break_every_table(monkeypatch)  # a resumed campaign would fail if it computed them again
        said: list[str] = []
        record_auxiliary_tables(store, resolve_model(MLP), SCENARIOS, {"backend": "sim"}, said.append)
        assert said == []
        assert (store.weight_stash(), store.get_meta("tensor_shard_shapes"), store.get_meta("loss_backward_transient"),
                store.get_meta("head_backward_transient")) == before


def test_a_recompute_profile_takes_the_heads_phase_recomputed(tmp_path):
    """[Note: the head's backward phase]: a recompute profile's head phase is measured checkpointed, and one
    recorded without (an earlier campaign's) is measured again."""
    with ProfileStore(tmp_path / "p.sqlite") as store:
        record_auxiliary_tables(store, resolve_model(MLP), SCENARIOS, {"backend": "sim"}, lambda line: None)
        assert {v["recompute"] for v in store.get_meta("head_backward_transient").values()} == {False}
        record_auxiliary_tables(store, resolve_model(MLP), SCENARIOS, {"backend": "sim", "activation_checkpointing": True},
                                lambda line: None)
        assert {v["recompute"] for v in store.get_meta("head_backward_transient").values()} == {True}


def test_a_heads_phase_without_its_input_bytes_is_taken_again(tmp_path):
    """A profile recorded before the head's input bytes were (28 Nov) gets them on its next campaign."""
    with ProfileStore(tmp_path / "p.sqlite") as store:
        record_auxiliary_tables(store, resolve_model(MLP), SCENARIOS, {"backend": "sim"}, lambda line: None)
        older = {d: {k: v for k, v in entry.items() if k != "input_bytes"}
                 for d, entry in store.get_meta("head_backward_transient").items()}
        store.set_meta("head_backward_transient", older)
        record_auxiliary_tables(store, resolve_model(MLP), SCENARIOS, {"backend": "sim"}, lambda line: None)
        assert {v["input_bytes"] for v in store.get_meta("head_backward_transient").values()} == {128}

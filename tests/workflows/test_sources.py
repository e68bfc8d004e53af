"""Where a command's inputs come from (workflows/sources.py): the user's options first, then the profile database,
then the defaults; the model a file names is imported only when the user names it.

The database is the MLP's memory profile of ``mlp_files`` (tests/conftest.py: global batch 32 in 2 micro-batches,
1F1B, no layer times); ``t.json`` beside it is a time profile of the MLP."""

from __future__ import annotations

import pytest

from hybridplan.errors import ProfileError, UsageError
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.workflows.sources import Sources, Targets
from tests.cli.conftest import MIXED, MLP


def test_without_a_database_only_the_users_options_count():
    with Sources.open(None) as sources:
        assert sources.db is None and sources.meta == {}
        assert sources.find_time_profile() is None
        with pytest.raises(UsageError, match="needs layer times") as e:
            sources.time_profile()
        assert e.value.message == "a time prediction needs layer times"  # no database to name
        with pytest.raises(UsageError, match="global batch size is unknown"):
            sources.targets(global_batch_size=None, num_microbatches=None, schedule=None)
        assert sources.targets(global_batch_size=8, num_microbatches=None, schedule=None) == Targets(8, None, "1f1b")
        assert sources.memory_predictor(Targets(8, 2, "1f1b")) is None


def test_the_database_gives_the_targets_the_user_did_not(mlp_files):
    with Sources.open(mlp_files / "p.sqlite") as sources:
        assert sources.targets(global_batch_size=None, num_microbatches=None, schedule=None) == Targets(32, 2, "1f1b")
        assert sources.targets(global_batch_size=64, num_microbatches=4, schedule="gpipe") == Targets(64, 4, "gpipe")
        assert sources.targets(global_batch_size=64, num_microbatches=None, schedule=None) == Targets(64, 2, "1f1b")


def test_layer_times_come_from_the_file_given_else_the_database(mlp_files):
    with Sources.open(mlp_files / "p.sqlite") as sources:
        assert sources.find_time_profile() is None  # a memory campaign only
        with pytest.raises(UsageError, match="holds none"):
            sources.time_profile()
    with Sources.open(mlp_files / "p.sqlite", time_profile=str(mlp_files / "t.json")) as sources:
        profile = sources.time_profile()
        assert profile.model == MLP and profile.num_layers == 5


def test_user_code_a_database_names_is_built_only_when_the_user_names_it(mlp_files):
    with Sources.open(mlp_files / "p.sqlite") as sources:
        with pytest.raises(ProfileError, match=f"add --model {MLP}"):
            sources.model()
    with Sources.open(mlp_files / "p.sqlite", model=MLP) as sources:
        assert sources.model_name() == MLP and sources.model().num_layers == 5
    with Sources.open(mlp_files / "p.sqlite", model="gpt-tiny") as sources:
        with pytest.raises(ProfileError, match="is another model"):
            sources.model_name()


def test_the_memory_predictor_is_the_databases_at_the_targets(mlp_files):
    notes: list[str] = []
    with Sources.open(mlp_files / "p.sqlite", warn=notes.append) as sources:
        predictor = sources.memory_predictor(Targets(32, 2, "1f1b"))
        plan = Plan.from_dict(MIXED)
        assert predictor.predict(plan).peak_memory_bytes == MemoryPredictor.from_db(mlp_files / "p.sqlite").predict(
            plan).peak_memory_bytes
        assert notes == []  # the profile's own targets: nothing extrapolated
        far = sources.memory_predictor(Targets(2 * 10**12, 2, "1f1b"))
        assert far.global_batch_size == 2 * 10**12 and len(notes) == 1 and "extrapolated" in notes[0]


def test_several_layer_time_files_one_per_device_type_make_one_profile(tmp_path):
    from hybridplan.profiling.layer_info import LayerInfo
    from hybridplan.profiling.time_profile import TimeProfile
    from hybridplan.profiling.timing_table import TimingTable

    layers = (LayerInfo(name="a", activation_bytes_per_sample=4.0, parameter_bytes=8.0),)
    for device, seconds in (("H100", 1.0), ("L4", 4.0)):
        TimeProfile(model="one", layers=layers, timings=(TimingTable(device_type=device, tensor_degree=1,
                    micro_batch_size=1, forward_s=(seconds,), backward_s=(2 * seconds,)),)).save(tmp_path / f"{device}.json")
    with Sources.open(None, time_profile=f"{tmp_path / 'H100.json'},{tmp_path / 'L4.json'}") as sources:
        profile = sources.time_profile()
        assert profile.device_types == ("H100", "L4") and profile.layer_times("L4", 1, 1)[0].tolist() == [4.0]
    # a file whose name holds a comma is still one file
    comma = tmp_path / "a,b.json"
    comma.write_text((tmp_path / "L4.json").read_text())
    with Sources.open(None, time_profile=str(comma)) as sources:
        assert sources.time_profile().device_types == ("L4",)
    with Sources.open(None, time_profile=f"{tmp_path / 'H100.json'},{tmp_path / 'none.json'}") as sources:
        with pytest.raises(ProfileError, match="none.json' does not exist"):
            sources.time_profile()

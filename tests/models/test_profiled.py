"""[Note: a file is data] (models/profiled.py): a model a file names is built only if it is a zoo model or the
user names it; an ``hf:`` configuration is data."""

from __future__ import annotations

import sys

import pytest

from hybridplan.errors import ProfileError
from hybridplan.models.profiled import model_fingerprint, model_for_profile, model_of_campaign, recorded_fingerprint

MLP = "tests.cli.user_models:mlp"


def test_a_file_naming_code_is_refused_without_the_users_word():
    with pytest.raises(ProfileError, match="add --model this:x"):
        model_for_profile("this:x", None, source="profile database 'p.sqlite'")
    assert "this" not in sys.modules  # nothing was imported (importing 'this' prints the Zen of Python)


def test_zoo_models_and_labels_need_no_word():
    assert model_for_profile("gpt-tiny", None, source="s") == "gpt-tiny"
    assert model_for_profile(None, None, source="s") is None
    assert model_for_profile("gpt2-amp-p3", None, source="s") is None  # a label: nothing to build


def test_the_users_model_must_build_the_recorded_one():
    from hybridplan.models.zoo import get_model

    recorded = model_fingerprint(get_model(MLP))
    assert model_for_profile(MLP, MLP, source="s", fingerprint=recorded) == MLP
    # another name that builds the same layers is accepted (e.g. the module moved)
    assert model_for_profile("old.place:mlp", MLP, source="s", fingerprint=recorded) == MLP
    with pytest.raises(ProfileError, match="is another model"):
        model_for_profile(MLP, "gpt-tiny", source="s", fingerprint=recorded)


def test_recorded_fingerprint_of_a_campaign_identity():
    from hybridplan.models.zoo import get_model

    model = get_model("gpt-tiny")
    identity = {"model": "gpt-tiny", "model_config": model.config(), "num_layers": model.num_layers,
                "layer_names": [model.layer_name(i) for i in range(model.num_layers)]}
    assert recorded_fingerprint(identity) == model_fingerprint(model)
    assert recorded_fingerprint({"model": "x"}) is None
    assert model_of_campaign(identity, None, source="s") == "gpt-tiny"
    with pytest.raises(ProfileError, match="records no zoo model"):
        model_of_campaign({"model": "label"}, None, source="s")


def test_hf_configs_are_data_and_a_changed_one_is_refused(tmp_path):
    """An ``hf:`` model is built from a config.json (data): a file naming it needs no word from the user; but
    a path whose config.json changed since the profile no longer stands for the measured model."""
    import json

    from hybridplan.models.hf_config import HF_CONFIGS
    from hybridplan.models.zoo import get_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_CONFIGS["llama-tiny"]))
    name = f"hf:{tmp_path}"
    recorded = model_fingerprint(get_model(name))
    assert model_for_profile("hf:llama-tiny", None, source="s") == "hf:llama-tiny"
    assert model_for_profile(name, None, source="s", fingerprint=recorded) == name
    path.write_text(json.dumps({**HF_CONFIGS["llama-tiny"], "num_hidden_layers": 3}))
    with pytest.raises(ProfileError, match="whose config.json has changed since"):
        model_for_profile(name, None, source="s", fingerprint=recorded)

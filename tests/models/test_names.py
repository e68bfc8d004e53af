"""Model names checked without torch, and [Note: a file is data]: a model a file names is built only if it is
a zoo model or the user names it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridplan.errors import ModelError, ProfileError
from hybridplan.models.names import (
    ZOO_NAMES,
    check_model_name,
    is_code_name,
    model_fingerprint,
    model_for_profile,
    model_of_campaign,
    recorded_fingerprint,
)

MLP = "tests.cli.user_models:mlp"


def test_zoo_names_are_the_registry():
    # in a fresh process: other tests register models of their own
    code = "from hybridplan.models.zoo import model_names; print(','.join(model_names()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert ZOO_NAMES == tuple(out.strip().split(","))


def test_checking_a_name_imports_no_torch():
    code = ("import sys; from hybridplan.models.names import check_model_name; check_model_name('gpt-tiny');"
            " check_model_name('pkg.mod:build'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("name, message", [
    ("gpt-huge", "did you mean one of ['gpt-tiny']"),
    ("resnet50", "unknown model 'resnet50'"),
    ("pkg:", "not of the form module:function"),
    ("a b:c", "not of the form module:function"),
])
def test_bad_names(name, message):
    with pytest.raises(ModelError) as e:
        check_model_name(name)
    assert message in str(e.value)


def test_code_names():
    assert is_code_name("os:system") and is_code_name("a.b.c:f") and not is_code_name("gpt-tiny")


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

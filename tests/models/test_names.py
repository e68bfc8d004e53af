"""Model names, checked without importing torch (models/names.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridplan.errors import ModelError
from hybridplan.models.names import ZOO_NAMES, check_model_name, is_code_name


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

"""The model registry (models/zoo.py): names to models."""

from __future__ import annotations

import pytest

from hybridplan.errors import ModelError
from hybridplan.models.zoo import get_model, model_names, resolve_model


def test_resolve_model_takes_a_name_or_an_object():
    by_name = resolve_model("gpt-tiny")
    assert by_name.name == "gpt-tiny" and by_name.num_layers == get_model("gpt-tiny").num_layers
    assert resolve_model(by_name) is by_name  # an object is used as it is
    with pytest.raises(ModelError, match="unknown model|closest"):
        resolve_model("gpt-tiniest")


def test_every_zoo_name_resolves_to_its_model():
    assert "gpt-tiny" in model_names()
    assert get_model("gpt-tiny") is not get_model("gpt-tiny")  # a fresh model per call

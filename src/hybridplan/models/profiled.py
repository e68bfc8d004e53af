"""Which model a profile stands for, without running code that a data file names.

[Note: a file is data] A profile database or a time profile records the name of the model it was
measured on. Building a zoo model runs only this package's code, and so does an ``hf:`` model (its
``config.json`` is data, built with transformers' own classes, never remote code); but building ``module:function``
imports that module and calls the function: a file naming ``os:system``-like code would run it. So a
model recorded in a file is used only if it is a zoo or ``hf:`` name (an ``hf:`` path whose config.json
still holds the recorded configuration), or if the user names a model on the command
line (``--model``): the user's name is the one imported, and when it differs from the recorded one it
must build the same model (same layers and hyper-parameters: :func:`model_fingerprint`).
:func:`model_for_profile` applies the rule; it imports torch only to build a model the user named.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hybridplan.errors import ProfileError
from hybridplan.models.names import check_model_name, is_code_name, is_hf_name, is_zoo_name

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel

__all__ = ["model_fingerprint", "recorded_fingerprint", "model_for_profile", "model_of_campaign"]


def model_fingerprint(model: LayeredModel) -> dict[str, Any]:
    """What makes two models the same for a profile: layers and hyper-parameters, not the name."""
    config = {k: v for k, v in model.config().items() if k != "name"}
    return {"config": config, "num_layers": model.num_layers,
            "layer_names": [model.layer_name(i) for i in range(model.num_layers)]}


def recorded_fingerprint(identity: Mapping[str, Any]) -> dict[str, Any] | None:
    """The :func:`model_fingerprint` a profiling campaign recorded in its identity (None if it lacks one)."""
    if not all(k in identity for k in ("model_config", "num_layers", "layer_names")):
        return None
    config = {k: v for k, v in identity["model_config"].items() if k != "name"}
    return {"config": config, "num_layers": identity["num_layers"], "layer_names": identity["layer_names"]}


def model_for_profile(
    recorded: str | None,
    given: str | None,
    *,
    source: str,
    fingerprint: Mapping[str, Any] | None = None,
) -> str | None:
    """The model a profile stands for, by [Note: a file is data].

    Args:
        recorded: the model name the file records (None if it records none).
        given: the ``--model`` the user gave (None if none).
        source: the file, for messages (e.g. ``"profile database 'p.sqlite'"``).
        fingerprint: the recorded :func:`model_fingerprint`, if the file has one; a ``given`` model
            that differs from ``recorded`` must match it (building ``given`` needs torch).

    Returns:
        The name to build: ``given`` if set, else ``recorded`` if it is a zoo or ``hf:`` name, else None (the file names
        no model, or only a label such as an imported profile's "gpt2-amp-p3": nothing to build).

    Raises:
        ModelError: if ``given`` is not a model name.
        ProfileError: if the file names code and the user did not, or ``given`` is another model.
    """
    if given is not None:
        check_model_name(given)
        if recorded is not None and given != recorded and fingerprint is not None:
            from hybridplan.models.zoo import get_model

            mine = model_fingerprint(get_model(given))
            theirs = {k: fingerprint.get(k) for k in mine}
            if not _json_equal(mine, theirs):
                differs = [k for k in mine if not _json_equal(mine[k], theirs[k])]
                raise ProfileError(
                    f"{source} was measured on model {recorded!r}; --model {given!r} is another model (differs in {differs})",
                    fix=f"give --model {recorded} or a model that builds the same layers, or profile {given} into a new database",
                )
        return given
    if recorded is not None and is_hf_name(recorded) and fingerprint is not None:
        _check_hf_unchanged(recorded, fingerprint, source)
    if recorded is None or is_zoo_name(recorded) or is_hf_name(recorded):
        return recorded
    if is_code_name(recorded):
        raise ProfileError(
            f"{source} names the model {recorded!r}, which is not a zoo model: building it would import and run code"
            " that a data file names",
            fix=f"if you trust that code, name it yourself: add --model {recorded}",
        )
    return None


def _check_hf_unchanged(recorded: str, fingerprint: Mapping[str, Any], source: str) -> None:
    """An ``hf:`` path names a file that may have changed since the profile: its configuration must be the
    recorded one (read as data, without torch)."""
    from hybridplan.models.hf_config import load_hf_config

    theirs = (fingerprint.get("config") or {}).get("hf_config")
    if theirs is not None and not _json_equal(load_hf_config(recorded), theirs):
        raise ProfileError(
            f"{source} was measured on {recorded!r}, whose config.json has changed since",
            fix="restore that config.json, or profile the changed model into a new database",
        )


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it (tuples are lists; a recorded fingerprint went through JSON)."""
    return bool(json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str))


def model_of_campaign(identity: Mapping[str, Any], given: str | None, *, source: str) -> str:
    """The model to run for a profiling campaign's recorded ``identity`` (:func:`model_for_profile`).

    Raises:
        ProfileError: as :func:`model_for_profile`, or if the campaign records no model.
    """
    name = model_for_profile(identity.get("model"), given, source=source, fingerprint=recorded_fingerprint(identity))
    if name is None:
        raise ProfileError(f"{source} records no zoo model (it names {identity.get('model')!r})", fix="give --model")
    return name

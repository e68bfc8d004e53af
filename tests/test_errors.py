"""The project's exception types (errors.py): the message names the problem, the fix goes on its own line, and
every kind is a :class:`HybridPlanError`, which the command line shows in two lines with exit code 2."""

from __future__ import annotations

import pickle

import pytest

from hybridplan.cli import main
from hybridplan.errors import ClusterError, HybridPlanError, ModelError, PlanError, ProfileError, UsageError

KINDS = [PlanError, ClusterError, ModelError, ProfileError, UsageError]


def test_the_fix_is_shown_on_a_second_line():
    error = HybridPlanError("stage 1 is empty", fix="give it a layer")
    assert str(error) == "stage 1 is empty\n  fix: give it a layer"
    assert (error.message, error.fix, error.args) == ("stage 1 is empty", "give it a layer", ("stage 1 is empty",))
    assert str(HybridPlanError("no fix here")) == "no fix here" and HybridPlanError("x").fix is None
    assert str(HybridPlanError("empty fix", fix="")) == "empty fix"


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_a_hybridplan_error_and_survives_pickling(kind):
    error = kind("bad value 3", fix="use 4")
    assert isinstance(error, HybridPlanError) and not isinstance(error, tuple(k for k in KINDS if k is not kind))
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is kind and (again.message, again.fix, str(again)) == (error.message, error.fix, str(error))


def test_the_command_line_shows_it_in_two_lines_with_code_2(tmp_path, capsys):
    missing = tmp_path / "missing.json"
    assert main(["predict", "--db", str(tmp_path / "missing.sqlite"), "--plan", str(missing)]) == 2
    err = capsys.readouterr().err.rstrip("\n").splitlines()
    assert len(err) == 2 and err[0].startswith("hybridplan predict: error: ") and err[1].startswith("  fix: ")

"""Every command the README shows is run here, so that none can rot.

The page's commands are read from it (its code blocks and its table's backticked ``hybridplan ...`` cells) and run
in order in one folder, on the tiny twin of their question: ``hf:llama-tiny`` for ``hf:llama2-7b``, a 1x4 mesh
for 2x8, a global batch of 8 in 2 micro-batches, and, where a command would run on the GPUs it names (``profile``,
``validate``), simulated devices of that GPU (``--backend sim``). The question itself, at full size, is in the slow
tier (benchmarks/instant_planning times it and checks its answer against simulated devices).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hybridplan.cli import main

pytest.importorskip("transformers")

README = Path(__file__).resolve().parents[1] / "README.md"
TWIN = [("hf:llama2-7b", "hf:llama-tiny"), ("--cluster 2x8", "--cluster 1x4"), ("--global-batch-size 64", "--global-batch-size 8"),
        ("--num-microbatches 8", "--num-microbatches 2")]
ON_DEVICES = ("profile", "validate")
"""Commands that run on the devices they name: run here on simulated ones."""


def readme_commands() -> list[str]:
    """The ``hybridplan`` commands of the README, in page order (continued lines joined)."""
    text = README.read_text()
    found: list[tuple[int, str]] = []
    for block in re.finditer(r"```\n(.*?)```", text, re.S):
        for line in block.group(1).replace("\\\n", " ").splitlines():
            if line.strip().startswith("hybridplan "):
                found.append((block.start(), " ".join(line.split())))
    for cell in re.finditer(r"`(hybridplan [^`]+)`", text):
        found.append((cell.start(), cell.group(1)))
    return [command for _, command in sorted(found)]


def twin(command: str) -> list[str]:
    for big, small in TWIN:
        command = command.replace(big, small)
    argv = shlex.split(command)[1:]
    if argv[0] in ON_DEVICES:
        argv.append("--backend=sim")
    return argv


def test_the_readme_shows_the_question_and_the_common_tasks() -> None:
    commands = readme_commands()
    assert commands[0].startswith("hybridplan plan --model hf:llama2-7b --cluster 2x8 --gpu h100-sxm")
    verbs = [c.split()[1] for c in commands]
    for verb in ("gpus", "show", "estimate-memory", "profile", "plan", "validate", "export", "cache"):
        assert verb in verbs, verb


def test_every_readme_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDPLAN_CACHE_DIR", str(tmp_path / "cache"))
    for command in readme_commands():
        argv = twin(command)
        assert main(argv) == 0, f"{command}\n  run as: hybridplan {' '.join(argv)}"
    assert Path("best.json").is_file() and Path("plan.png").is_file() and Path("v.json").is_file()


@pytest.mark.slow
def test_the_question_at_full_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDPLAN_CACHE_DIR", str(tmp_path / "cache"))
    assert main(shlex.split(readme_commands()[0])[1:]) == 0
    assert "predicted plan peak" in capsys.readouterr().out

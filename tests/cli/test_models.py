"""``hybridplan models`` as a user calls it; and the exit code of a command interrupted by Ctrl-C (the
``models`` command stands for any)."""

from __future__ import annotations

import json

from hybridplan.cli import main


def test_models_lists_the_zoo(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("gpt-tiny", "gpt3-1.3b", "moe-tiny", "wresnet-tiny", "vgg11", "vgg11-tiny"):
        assert name in out
    for name in ("hf:llama3-8b", "hf:mistral-7b", "hf:qwen2-7b", "hf:gpt2", "hf:mixtral-8x7b", "hf:llama-tiny"):
        assert name in out  # HuggingFace configurations shipped with hybridplan


def test_models_json_gives_each_model_its_layers_and_parameters(capsys):
    import torch

    from hybridplan.models import get_model, model_names

    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == list(model_names())
    assert rows["gpt-tiny"]["layers"] == 10 and rows["wresnet-tiny"]["layers"] == 7  # as the plans of tests/ cut them
    model = get_model("gpt-tiny")  # its parameters counted here, layer by layer on the meta device
    with torch.device("meta"):
        count = sum(p.numel() for i in range(model.num_layers) for p in model.build_layer(i).parameters())
    assert rows["gpt-tiny"]["parameters"] == count > 0


def test_ctrl_c_ends_a_command_with_code_130_and_no_traceback(monkeypatch, capsys):
    import hybridplan.cli.models as models_cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(models_cli, "handle", interrupted)
    assert main(["models"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted" and "Traceback" not in err

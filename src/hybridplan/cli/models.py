"""``hybridplan models``: list the model zoo."""

from __future__ import annotations

import argparse
import json

from hybridplan.cli.common import add_command


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "models",
        help="list the model zoo",
        description="List the zoo models with their layer counts, parameter counts (counted on the meta device: no "
        "memory needed) and sizes. Any command's --model takes one of these names, hf:NAME_OR_PATH for a HuggingFace "
        "model's config.json (transformers builds it), or module:function for your own "
        "model (a function returning a LayeredModel or an nn.Sequential).",
        reads="nothing.",
        writes="a table to the terminal (or JSON with --json). No files.",
        examples=["hybridplan models", "hybridplan models --json"],
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from hybridplan.models import get_model, model_names

    rows = []
    for name in model_names():
        model = get_model(name)
        rows.append({"name": name, "layers": model.num_layers, "parameters": model.parameter_count(), "config": model.config(), "describe": model.describe()})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'model':<16} {'layers':>6} {'parameters':>14}  description")
    for r in rows:
        print(f"{r['name']:<16} {r['layers']:>6} {r['parameters']:>14,}  {r['describe'].split(': ', 1)[-1]}")
    from hybridplan.models.hf_config import HF_CONFIGS

    print("\nHuggingFace models: --model hf:NAME_OR_PATH, a config.json (or a folder holding one) of a Llama, Mistral,"
          " Qwen2, Mixtral or GPT-2 model, or one shipped: " + ", ".join(f"hf:{k}" for k in HF_CONFIGS) + ".")
    print("User models: --model module:function (returning a LayeredModel or an nn.Sequential).")
    return 0

"""The one-shot estimate (``hybridplan estimate-memory``) against a profiled prediction and a measured run, and
against ``accelerate estimate-memory``'s arithmetic.

Run from the repository root (a few minutes on a 2-core CPU; ``accelerate`` from the ``engines`` extra)::

    .venv/bin/python -m benchmarks.estimate_memory.run

For gpt-tiny and wresnet-tiny on 1x4 (global batch 16 in 4 micro-batches, 1F1B, a tensor x2 stage and two
single-device stages), each step is the CLI, timed: ``estimate-memory --plan`` (simulated distinct stages, no
profile); ``profile --backend sim`` (the campaign) then ``predict``; ``validate --backend real`` (4 real
processes: the measured peaks). Printed: wall seconds of each, and every device's estimate, prediction and
measurement with the estimate's error against both. Then the whole model on one device: ``estimate-memory``
against accelerate's ``estimate_training_usage`` of ``calculate_maximum_sizes`` (the functions behind
``accelerate estimate-memory``, which needs the Hugging Face Hub), applied to the model's layers on the meta device.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    "gpt-tiny": [([0, 3], "tensor", 2), ([3, 7], "none", 1), ([7, 10], "none", 1)],
    "wresnet-tiny": [([0, 2], "tensor", 2), ([2, 5], "none", 1), ([5, 7], "none", 1)],
}
BATCH, MICRO = 16, 4


def _plan(stages: list, devices: int = 0) -> dict:
    out = []
    for layers, kind, degree in stages:
        out.append({"layers": layers, "parallelism": kind, "degree": degree, "devices": list(range(devices, devices + degree))})
        devices += degree
    return {"schedule": "1f1b", "global_batch_size": BATCH, "num_microbatches": MICRO, "stages": out}


def _cli(*args: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hybridplan", *args], capture_output=True, text=True, check=True)
    return done.stdout, time.perf_counter() - t0


def _accelerate(model_name: str) -> int | None:
    try:
        from accelerate.commands.estimate import estimate_training_usage
        from accelerate.utils import calculate_maximum_sizes
    except ImportError:
        return None
    import torch
    from torch import nn

    from hybridplan.models.zoo import get_model

    m = get_model(model_name)
    with torch.device("meta"):
        seq = nn.Sequential(*[m.build_layer(i) for i in range(m.num_layers)])
    total, _ = calculate_maximum_sizes(seq)
    return int(max(estimate_training_usage(total, "float32").values()))


def main() -> None:
    rows, single = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for model, stages in MODELS.items():
            plan = Path(tmp) / f"{model}.json"
            plan.write_text(json.dumps(_plan(stages)))
            db = str(Path(tmp) / f"{model}.sqlite")
            out, t_est = _cli("estimate-memory", "--model", model, "--cluster", "1x4", "--plan", str(plan), "--json")
            est = {d["device"]: d["peak_memory_bytes"] for d in json.loads(out)["estimates"][0]["devices"]}
            _, t_prof = _cli("profile", "--model", model, "--cluster", "1x4", "--global-batch-size", str(BATCH),
                             "--num-microbatches", str(MICRO), "--backend", "sim", "--db", db)
            out, t_pred = _cli("predict", "--db", db, "--plan", str(plan), "--json")
            pred = {d["device"]: d["peak_memory_bytes"] for d in json.loads(out)["devices"]}
            out, t_val = _cli("validate", "--db", db, "--plan", str(plan), "--backend", "real", "--json")
            meas = {d["device"]: d["measured"] for d in json.loads(out)["devices"]}
            rows.append((model, t_est, t_prof, t_pred, t_val, est, pred, meas))
            n = sum(len(range(*s[0])) for s in stages)
            one = Path(tmp) / f"{model}-one.json"
            one.write_text(json.dumps(_plan([([0, n], "none", 1)])))
            out, _ = _cli("estimate-memory", "--model", model, "--cluster", "1x1", "--plan", str(one), "--json")
            single.append((model, json.loads(out)["estimates"][0]["peak_memory_bytes"], _accelerate(model)))
    print("| model | estimate-memory s | profile (sim) s | predict s | validate (real) s |")
    print("|---|---|---|---|---|")
    for model, t_est, t_prof, t_pred, t_val, *_ in rows:
        print(f"| {model} | {t_est:.1f} | {t_prof:.1f} | {t_pred:.1f} | {t_val:.1f} |")
    print("\n| model | device | estimate B | predicted B | measured B | estimate vs predicted | estimate vs measured |")
    print("|---|---|---|---|---|---|---|")
    for model, *_, est, pred, meas in rows:
        for d in sorted(est):
            print(f"| {model} | {d} | {est[d]:,} | {pred[d]:,} | {meas[d]:,} | {100 * (est[d] - pred[d]) / pred[d]:+.2f}% |"
                  f" {100 * (est[d] - meas[d]) / meas[d]:+.2f}% |")
    print("\n| model (1 device) | estimate-memory B | accelerate's 'Training using Adam' B | ratio |")
    print("|---|---|---|---|")
    for model, ours, theirs in single:
        ratio = "-" if theirs is None else f"{ours / theirs:.2f}"
        print(f"| {model} | {ours:,} | {'-' if theirs is None else f'{theirs:,}'} | {ratio} |")


if __name__ == "__main__":
    main()

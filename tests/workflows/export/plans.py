"""Plans of gpt-tiny's 10 layers (embed, block0..block7, head) shared by the export tests, and its layers."""

from __future__ import annotations

from hybridplan.plan import Plan
from hybridplan.workflows.export import ModelLayers

GPT_TINY = ModelLayers.of("gpt-tiny", ["embed"] + [f"block{i}" for i in range(8)] + ["head"],
                          {"family": "gpt", "num_blocks": 8, "hidden_size": 64, "num_heads": 4, "seq_len": 16,
                           "vocab_size": 128})


def uniform(cuts: list[int], d: int = 1, t: int = 1, *, schedule: str = "1f1b", zero: int = 0,
            recompute: str = "none", batch: int = 32, microbatches: int = 8) -> Plan:
    """Stages ``[cuts[k], cuts[k+1])`` of ``d x t`` devices each, devices in order."""
    k = d * t
    stages = []
    for i in range(len(cuts) - 1):
        kind = "data+tensor" if d > 1 and t > 1 else "tensor" if t > 1 else "data" if d > 1 else "none"
        s = {"layers": [cuts[i], cuts[i + 1]], "parallelism": kind, "degree": k, "devices": list(range(i * k, (i + 1) * k))}
        if kind == "data+tensor":
            s["tensor_degree"] = t
        if zero:
            s["zero"] = zero
        if recompute != "none":
            s["recompute"] = recompute
        stages.append(s)
    return Plan.from_dict({"schedule": schedule, "global_batch_size": batch, "num_microbatches": microbatches,
                           "stages": stages})

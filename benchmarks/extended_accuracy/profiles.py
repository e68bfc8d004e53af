"""The two profiles per model that benchmarks/extended_accuracy predicts from (resumable).

- ``<model>-2x4-zero.sqlite``: ``hybridplan profile``'s default scenarios on 2x4 (pipeline, data and tensor at
  degrees 2 and 4) plus the ZeRO-3 scenarios (``--zero``: ``data2-zero3``, ``data4-zero3``), simulated devices;
- ``<model>-2x4-recompute.sqlite``: the same default scenarios taken with activation checkpointing
  (``--activation-checkpointing``), which predicts the stages a plan recomputes (``--recompute-db``). Without the
  ZeRO-3 scenarios: they would double its runs, so a stage both recomputed and ZeRO-3 is not drawn.

Run alone (``python -m benchmarks.extended_accuracy.profiles``) to take them before the plans, in the background.
"""

from __future__ import annotations

from pathlib import Path

from hybridplan.plan import Cluster
from hybridplan.workflows.runs import ensure_profile

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
MESH = "2x4"
MODELS = {"gpt-tiny": (64, 4), "wresnet-tiny": (64, 4), "moe-tiny": (64, 4)}
"""Model -> (global batch, micro-batches): micro-batches of 16 samples, which every data degree of 8 devices divides;
profiled at global batches 32 and 16 (micro-batches of 8 and 4, which data x4 divides)."""


def base_profile(model: str) -> Path:
    """The profile with the ZeRO-3 scenarios (taken if missing, resumed if unfinished)."""
    batch, micro = MODELS[model]
    say = lambda msg: print(f"  [{model}] {msg}", flush=True)  # noqa: E731
    return ensure_profile(WORK / f"{model}-{MESH}-zero.sqlite", model=model, cluster=Cluster.parse(MESH),
                          global_batch_size=batch, num_microbatches=micro, run_options={"backend": "sim"},
                          zero=True, progress=say)


def recompute_profile(model: str) -> Path:
    """The profile taken with activation checkpointing (taken if missing, resumed if unfinished)."""
    batch, micro = MODELS[model]
    say = lambda msg: print(f"  [{model} recompute] {msg}", flush=True)  # noqa: E731
    return ensure_profile(WORK / f"{model}-{MESH}-recompute.sqlite", model=model, cluster=Cluster.parse(MESH),
                          global_batch_size=batch, num_microbatches=micro,
                          run_options={"backend": "sim", "activation_checkpointing": True}, progress=say)


def main() -> None:
    for model in MODELS:
        base_profile(model)
        recompute_profile(model)


if __name__ == "__main__":
    main()

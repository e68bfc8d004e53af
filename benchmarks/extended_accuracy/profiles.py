"""The two profiles per model that benchmarks/extended_accuracy predicts from (resumable).

- ``<model>-2x4-zero.sqlite``: ``hybridplan profile``'s default scenarios on 2x4 (pipeline, data and tensor at
  degrees 2 and 4) plus the ZeRO-3 scenarios (``--zero``: ``data2-zero3``, ``data4-zero3``), simulated devices;
- ``<model>-2x4-recompute.sqlite``: taken with activation checkpointing (``--activation-checkpointing``), which
  predicts the stages a plan recomputes (``--recompute-db``): gpt-tiny's with the default scenarios, the other two
  models' with pipeline, data2 and tensor2 only (``--scenarios pipeline,data2,tensor2``: the degree-4 scenarios
  are two thirds of the runs, and the shared 2-core machine could not give them before the deadline), so their
  recomputed stages are pipeline-only, x2 and data x tensor 2 x 2 (a replica of tensor2). Without the ZeRO-3
  scenarios (they would double the runs), so no stage is both recomputed and ZeRO-3.

Run alone (``python -m benchmarks.extended_accuracy.profiles``) to take them before the plans, in the background.
"""

from __future__ import annotations

from pathlib import Path

from hybridplan.plan import Cluster
from hybridplan.profiling.partitions import Scenario
from hybridplan.workflows.runs import ensure_profile

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
MESH = "2x4"
MODELS = {"gpt-tiny": (64, 4), "wresnet-tiny": (64, 4), "moe-tiny": (64, 4)}
"""Model -> (global batch, micro-batches): micro-batches of 16 samples, which every data degree of 8 devices divides;
profiled at global batches 32 and 16 (micro-batches of 8 and 4, which data x4 divides)."""
RECOMPUTE_SCENARIOS: dict[str, tuple[Scenario, ...] | None] = {
    "gpt-tiny": None,  # the default scenarios
    "wresnet-tiny": (Scenario("none", 1), Scenario("data", 2), Scenario("tensor", 2)),
    "moe-tiny": (Scenario("none", 1), Scenario("data", 2), Scenario("tensor", 2)),
}
"""Scenarios of each recompute profile (None: the default ones); see the module docstring."""


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
                          run_options={"backend": "sim", "activation_checkpointing": True},
                          scenarios=RECOMPUTE_SCENARIOS[model], progress=say)


def main() -> None:
    for model in MODELS:
        base_profile(model)
        recompute_profile(model)


if __name__ == "__main__":
    main()

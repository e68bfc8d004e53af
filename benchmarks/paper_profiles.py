"""The models and settings the paper-reproducing benchmarks share, and their profiles (made once, resumable).

Paper sizes run on simulated devices (``backend="sim"``: fake tensors, byte-identical to the real CPU
runtime, GPU allocator terms with ``device="cuda"``) on the 4x4 mesh of CAPTURE's evaluation (seed 001: 4
nodes of 4 A100 40 GB). Batches are smaller than Alpa's benchmark suite (GPT-3 1.3B: 1024 in 64
micro-batches) but keep its micro-batch of 16 sequences: a simulation costs time per operation, so 16
micro-batches instead of 64 keep a profile under an hour on a 2-core machine. The tiny model runs on the
real CPU runtime (one process per device, gloo).

Profiles live in ``benchmarks/work/`` (not committed; each is rebuilt by the first benchmark that needs it,
and a campaign interrupted half-way resumes). Run from the repository root, e.g.::

    .venv/bin/python -m benchmarks.paper_profiles            # all profiles (about 2 h on 2 cores)
    .venv/bin/python -m benchmarks.paper_profiles wresnet-1b
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridplan.plan.cluster import Cluster
from hybridplan.workflows.runs import ensure_profile

WORK = Path(__file__).resolve().parent / "work"
CAPACITY = "40GiB"
"""The devices of CAPTURE's evaluation: A100 40 GB (taken as 40 GiB)."""


@dataclass(frozen=True)
class Case:
    """A model, its mesh and its training settings."""

    model: str
    mesh: str
    global_batch_size: int
    num_microbatches: int
    precision: str
    backend: str = "sim"
    schedule: str = "1f1b"
    """Schedule of the profiling runs (the statistics serve every schedule; a run's identity includes it)."""
    profile_capacity: str | None = None
    """Device memory the profiling cluster had (part of the campaign's identity); None: unlimited."""
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def db(self) -> Path:
        return WORK / f"{self.model}-{self.mesh}-b{self.global_batch_size}-m{self.num_microbatches}-{self.precision}.sqlite"

    @property
    def run_options(self) -> dict[str, Any]:
        device = "cuda" if self.backend == "sim" else "cpu"
        # the keys 'hybridplan profile' records, so that a profile made with the CLI is the same campaign
        return {"backend": self.backend, "device_type": device, "precision": self.precision, "loss_scale": None,
                "activation_checkpointing": False, **self.options}

    def cluster(self, memory: str | None = CAPACITY) -> Cluster:
        """The mesh, with ``memory`` per device (None: unlimited, to measure peaks above the capacity)."""
        return Cluster.parse(self.mesh, device_memory=memory)


CASES: dict[str, Case] = {
    # GPT-3 and MoE: mixed precision (Alpa trains them in fp16; bf16 here, same bytes), micro-batches of 16
    # sequences (Alpa's GPT suite) and 32 for MoE (so that 4-way data parallelism splits the profiled
    # micro-batches into whole GShard groups of 2 sequences).
    "gpt3-1.3b": Case("gpt3-1.3b", "4x4", 256, 16, "bf16"),
    "moe-1.3b": Case("moe-1.3b", "4x4", 512, 16, "bf16"),
    # Wide-ResNet 1B: CAPTURE's prediction-accuracy model (its plans were GPipe), profiled on 40 GiB devices.
    "wresnet-1b": Case("wresnet-1b", "4x4", 256, 16, "bf16", schedule="gpipe", profile_capacity=CAPACITY),
    # The real CPU runtime: 4 processes, fp32, exact storage counts.
    "wresnet-tiny": Case("wresnet-tiny", "1x4", 64, 4, "fp32", backend="real"),
}


def profile(case: Case) -> Path:
    """The case's profile database, profiled now if missing or incomplete."""
    say = lambda msg: print(f"  [{case.model}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    return ensure_profile(case.db, model=case.model, cluster=Cluster.parse(case.mesh, device_memory=case.profile_capacity),
                          global_batch_size=case.global_batch_size, num_microbatches=case.num_microbatches,
                          schedule=case.schedule, run_options=case.run_options, progress=say)


def measured_layer_times(case: Case) -> list[float] | None:
    """Per-layer forward + backward seconds of one micro-batch, measured on the real runtime
    (``hybridplan profile --time``; what torchgpipe's ``balance_by_time`` weighs: its ``profile_times`` times each
    layer's forward and backward together). Only for cases on the real runtime, whose device (this CPU) is the
    one timed; None for simulated cases, whose GPU times cannot be measured here."""
    if case.backend != "real":
        return None
    from hybridplan.cli import main
    from hybridplan.profiling.store import ProfileStore
    from hybridplan.profiling.stored_time_profile import time_profile_from_store

    db = WORK / f"{case.model}-{case.mesh}-times.sqlite"
    argv = ["profile", "--model", case.model, "--cluster", case.mesh, "--global-batch-size", str(case.global_batch_size),
            "--num-microbatches", str(case.num_microbatches), "--time", "--db", str(db), "--time-degrees", "1"]
    if main(argv) != 0:
        raise SystemExit(f"timing {case.model} failed")
    with ProfileStore(db, create=False) as store:
        profile = time_profile_from_store(store)
    fwd, bwd = profile.layer_times(profile.reference_device_type, 1, case.global_batch_size // case.num_microbatches)
    return [float(f + b) for f, b in zip(fwd, bwd)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases", nargs="*", metavar="CASE", help=f"the cases to profile (default: all of {', '.join(CASES)})")
    args = ap.parse_args()
    for name in args.cases:
        if name not in CASES:
            ap.error(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    for name in args.cases or list(CASES):
        print(f"{name}: {profile(CASES[name])}")


if __name__ == "__main__":
    main()

"""Profiling cost: how many runs a campaign needs, per scenario, against CAPTURE's Description 1.

Description 1 (seed 000) needs at most L + 1 runs per scenario and batch size, "10 * (L - 1)" in total
for the pipeline, 2- and 4-way data and tensor scenarios at two batch sizes. hybridplan packs the same
statistics into fewer runs (profiling/partitions.py). Counted with the campaign's own dry run: no run
is executed, so this is exact and takes seconds.

    .venv/bin/python -m benchmarks.profiling_cost.run
"""

from __future__ import annotations

import argparse
from collections import Counter

from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.campaign import Campaign, CampaignConfig
from hybridplan.profiling.store import ProfileStore

CASES = [  # model, mesh, global batch, micro-batches (the CAPTURE/Alpa evaluation's models and 4x4 mesh)
    ("gpt3-1.3b", "4x4", 1024, 64),
    ("gpt3-2.6b", "4x4", 1024, 64),
    ("gpt3-6.7b", "4x4", 1024, 64),
    ("moe-2.4b", "4x4", 1024, 32),
    ("wresnet-1b", "4x4", 1536, 24),
    ("wresnet-2b", "4x4", 1536, 24),
    ("vgg11", "1x4", 1104, 12),  # mCAP's VGG11 setup: 4 GPUs, batch 1104 in 12 micro-batches
    ("gpt-tiny", "1x4", 64, 4),
]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()  # no options: --help only
    print(f"{'model':<12} {'mesh':<5} {'L':>3} {'scenario':<9} {'runs/batch':>10} {'L+1':>4}   total (ours / 10(L-1))")
    for model, mesh, batch, micro in CASES:
        with ProfileStore(":memory:") as store:
            campaign = Campaign(CampaignConfig(model=model, cluster=Cluster.parse(mesh), global_batch_size=batch,
                                               num_microbatches=micro), store)
            runs = campaign.dry_run()
        per = Counter(s.name for _, s, _ in runs)
        L = campaign.L
        for i, scenario in enumerate(campaign.scenarios):
            total = f"{len(runs)} / {10 * (L - 1)}" if i == 0 else ""
            print(f"{model if i == 0 else '':<12} {mesh if i == 0 else '':<5} {L if i == 0 else '':>3} {scenario.name:<9}"
                  f" {per[scenario.name] // len(campaign.batch_sizes):>10} {L + 1:>4}   {total}")


if __name__ == "__main__":
    main()

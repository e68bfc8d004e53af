"""Where the tests find the repository and the shared data beside it (``../shared``: public measured data with
provenance; tests that read it skip when it is absent, as the README says)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# gpt-tiny on 1x4: a tensor x2 stage, a pipeline stage and a data stage of degree 1 (the README's example plan)
GPT_PLAN = {
    "schedule": "1f1b",
    "global_batch_size": 32,
    "num_microbatches": 8,
    "stages": [
        {"layers": [0, 3], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
        {"layers": [3, 7], "parallelism": "none", "degree": 1, "devices": [2]},
        {"layers": [7, 10], "parallelism": "data", "degree": 1, "devices": [3]},
    ],
}

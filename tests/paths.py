"""Where the tests find the repository and the shared data beside it (``../shared``: public measured data with
provenance; tests that read it skip when it is absent, as the README says)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

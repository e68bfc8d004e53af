"""What the report tests share (tests/report/ and tests/cli/test_report.py): a plan, a validation of it, the
benchmark documents, and helpers to write a JSON input and check a PNG."""

from __future__ import annotations

import json

GIB = 2**30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLAN = {"schedule": "gpipe", "global_batch_size": 8, "num_microbatches": 2, "stages": [
    {"layers": [0, 2], "parallelism": "none", "degree": 1, "devices": [0]},
    {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [1]}]}
VALIDATION = {"plan": PLAN, "status": "ok", "reason": None, "devices": [
    {"device": 0, "stage": 0, "predicted": 3 * GIB, "measured": 2 * GIB, "relative_error": 0.5},
    {"device": 1, "stage": 1, "predicted": GIB, "measured": GIB, "relative_error": 0.0}],
    "max_abs_relative_error": 0.5, "predicted_peak_bytes": 3 * GIB, "measured_peak_bytes": 2 * GIB}


def png(path) -> bytes:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 2000
    return data


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def benchmark_documents() -> tuple[dict, dict, dict, dict]:
    """A memory comparison, prediction errors, a plan sweep and a scaling study, as the benchmarks write them."""
    dev = lambda d, p, m: {"device": d, "stage": d, "predicted": p, "measured": m}  # noqa: E731
    comparison = {"format": "hybridplan.memory_comparison", "title": "t", "groups": [
        {"title": "g", "capacity_bytes": 1.5 * GIB, "plans": [{"name": "ours", "devices": [dev(0, GIB, GIB), dev(1, GIB, GIB)]},
                                 {"name": "equal", "devices": [dev(0, GIB, 2 * GIB), dev(1, GIB, GIB // 2)]}]}]}
    errors = {"format": "hybridplan.prediction_errors", "title": "e", "plans": [
        {"devices": [dev(0, 101, 100), dev(1, 90, 100)]}, {"devices": [dev(0, 100, 100)]}]}
    sweep = {"format": "hybridplan.plan_sweep", "title": "s", "picks": {"ours": 1, "other": 0}, "plans": [
        {"label": "p0", "predicted_peak_bytes": 3, "measured_peak_bytes": 30}, {"label": "p1", "predicted_peak_bytes": 2,
         "measured_peak_bytes": 21}, {"label": "p2", "predicted_peak_bytes": 1, "measured_peak_bytes": 20},
        {"label": "p3", "predicted_peak_bytes": 1, "measured_peak_bytes": None}]}
    scaling = {"format": "hybridplan.scaling", "title": "l", "capacity_bytes": GIB, "width_name": "channels", "series": [
        {"name": "ours", "points": [{"width": 1, "parameters": 300, "peak_memory_bytes": 10, "fits": True},
                                    {"width": 2, "parameters": 600, "peak_memory_bytes": None, "fits": False}]},
        {"name": "time", "points": [{"width": 1, "parameters": 200, "peak_memory_bytes": 10, "fits": True}]}]}
    return comparison, errors, sweep, scaling


def benchmark_views(tmp_path) -> list:
    """The :func:`benchmark_documents`, written to files and read back as views."""
    from hybridplan.report.data import load_view

    return [load_view(write(tmp_path, f"{i}.json", d)) for i, d in enumerate(benchmark_documents())]

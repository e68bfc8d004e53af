"""A plan as a picture (report/plan_picture.py, report/device_memory.py), read as a person reads it: the legend names
each stage, every device has its bar with its total on top, the capacity line is at the capacity, the timeline has a
box per forward and backward of every micro-batch on every stage, forwards before their backwards.

The plan: the MLP (5 layers) in two stages on a 2x4 mesh, the first data 2 x tensor 2, the second tensor 2 (two
devices idle); its prediction is what ``hybridplan predict --json`` prints (``PlanPrediction.to_dict``) from the
MLP's profile (``mlp_files``, tests/conftest.py)."""

from __future__ import annotations

import copy

import pytest

from hybridplan.errors import UsageError
from hybridplan.plan import Cluster, Plan
from hybridplan.report.device_memory import plan_memory_from
from hybridplan.report.plan_picture import draw_plan, write_png
from hybridplan.report.timeline import play, unit_durations
from hybridplan.units import format_bytes
from tests.report.util import png

PLAN = {"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 4, "stages": [
    {"layers": [0, 3], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "devices": [0, 1, 2, 3]},
    {"layers": [3, 5], "parallelism": "tensor", "degree": 2, "devices": [4, 5]}]}
KIB = 1024


def prediction_of(db, plan: dict) -> dict:
    """What 'hybridplan predict --db DB --plan PLAN --json' prints (tests/cli/test_predict.py checks that it is)."""
    from hybridplan.predict.memory import MemoryPredictor

    p = Plan.from_dict(plan)
    return MemoryPredictor.from_db(db, schedule=p.schedule, global_batch_size=p.global_batch_size,
                                   num_microbatches=p.num_microbatches).predict(p).to_dict()


@pytest.fixture(scope="module")
def prediction(mlp_files) -> dict:
    return prediction_of(mlp_files / "p.sqlite", PLAN)


def _picture(prediction: dict | None, capacity: str | None = "20KiB", plan: dict = PLAN):
    p = Plan.from_dict(plan)
    cluster = Cluster.parse("2x4", device_memory=capacity)
    memory = None if prediction is None else plan_memory_from(prediction, p, "p.json", validation=False)
    return draw_plan(p, cluster, play(p, unit_durations(p), unit="unit", source="unit times"), memory)


def _axes(fig):
    """The mesh, the memory bars (if drawn) and the timeline, in that order."""
    return fig.axes


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_each_stage_is_named_with_its_layers_degrees_zero_and_recompute(prediction):
    mesh = _axes(_picture(prediction))[0]
    assert _legend(mesh) == ["stage 0: layers 0-2, data 2 x tensor 2", "stage 1: layers 3-4, data 1 x tensor 2"]
    sharded = copy.deepcopy(PLAN)
    sharded["stages"][0].update(zero=1, recompute="full")
    sharded["stages"][1] = {"layers": [3, 5], "parallelism": "data", "degree": 2, "devices": [4, 5]}
    mesh = _axes(_picture(None, plan=sharded))[0]
    assert _legend(mesh) == ["stage 0: layers 0-2, data 2 x tensor 2, ZeRO-1, recompute",
                             "stage 1: layers 3-4, data 2 x tensor 1"]


def test_the_mesh_has_a_cell_per_device_coloured_by_stage_and_the_idle_ones_grey(prediction):
    mesh = _axes(_picture(prediction))[0]
    cells = {p.get_gid(): p.get_facecolor() for p in mesh.patches if (p.get_gid() or "").startswith("device")}
    assert len(cells) == 8
    stage0, stage1 = (h.get_facecolor() for h in mesh.get_legend().legend_handles)
    assert all(cells[f"device {d}"] == stage0 for d in range(4))
    assert cells["device 4"] == cells["device 5"] == stage1 != stage0
    assert cells["device 6"] == cells["device 7"] not in (stage0, stage1)
    texts = [t.get_text() for t in mesh.texts]
    assert "3\ns0 d1 t1" in texts and "5\ns1 d0 t1" in texts and "6\nidle" in texts  # devices listed tensor-fastest


def _stacks(ax) -> dict[float, list[tuple[str, float]]]:
    """Per bar position, its segments bottom to top: (segment, height)."""
    out: dict[float, list[tuple[str, float]]] = {}
    for container in ax.containers:
        for rect in container:
            if rect.get_height():
                out.setdefault(round(rect.get_x() + rect.get_width() / 2, 6), []).append((rect.get_gid(),
                                                                                           rect.get_height()))
    return out


def test_a_bar_per_device_its_total_the_predicted_peak_and_the_peak_split_by_its_action(prediction):
    memory = _axes(_picture(prediction))[1]
    stacks = _stacks(memory)
    assert sorted(stacks) == [0, 1, 2, 3, 4, 5]  # a bar per used device, in device order
    peaks = [d["peak_memory_bytes"] for d in sorted(prediction["devices"], key=lambda d: d["device"])]
    for x, peak in enumerate(peaks):
        assert sum(h for _, h in stacks[x]) == pytest.approx(peak / KIB)  # the axis is in KiB
    # on top: the total and its share of the 20 KiB capacity
    assert [t.get_text() for t in memory.texts] == [f"{format_bytes(p)}\n{round(100 * p / (20 * KIB))}%" for p in peaks]
    # Device 0 (stage 0 of 2, 1F1B, 4 micro-batches: F0 F1 B0 F2 B1 F3 B2 B3) peaks in B1: two micro-batches in flight,
    # the gradients allocated by B0, B1's temporaries. Device 4 (the last stage: F0 B0 ...) peaks in its first
    # backward: one micro-batch in flight, no gradient yet.
    q0 = prediction["devices"][0]["quantities"]
    assert stacks[0] == [(k, pytest.approx(v / KIB)) for k, v in (
        ("static", q0["static"]), ("gradient", q0["gradient"]), ("activation", 2 * q0["activation"] + q0["data"]),
        ("transient", q0["backward_transient"]))]
    q4 = prediction["devices"][4]["quantities"]
    assert stacks[4] == [(k, pytest.approx(v / KIB)) for k, v in (
        ("static", q4["static"]), ("activation", q4["activation"] + q4["data"]),
        ("transient", q4["first_backward_transient"]))]


def test_the_capacity_line_is_at_the_capacity(prediction):
    memory = _axes(_picture(prediction, capacity="20KiB"))[1]
    (line,) = [ln for ln in memory.lines if ln.get_gid() == "capacity"]
    assert list(line.get_ydata()) == [20, 20]
    assert "capacity 20.00 KiB" in _legend(memory)
    memory = _axes(_picture(prediction, capacity=None))[1]
    assert not [ln for ln in memory.lines if ln.get_gid() == "capacity"]
    assert "no capacity" in memory.get_title()
    # far above the bars (1 GiB against 18 KiB) the line would squash them: the legend names it instead
    memory = _axes(_picture(prediction, capacity="1GiB"))[1]
    assert not [ln for ln in memory.lines if ln.get_gid() == "capacity"]
    assert "capacity 1.00 GiB (off scale)" in _legend(memory)
    assert memory.texts[0].get_text().endswith("\n0%")


def test_a_peak_no_action_gives_is_drawn_whole_and_cuda_terms_on_top(prediction):
    """A peak the quantities do not give (here 1 KiB more) is one segment, never split; the allocator's cache and the
    memory outside it stack on top, and the total written is reserved + outside."""
    changed = copy.deepcopy(prediction)
    d0 = changed["devices"][0]
    d0["peak_memory_bytes"] += KIB
    d0.update(reserved_peak_bytes=d0["peak_memory_bytes"] + 2 * KIB, overhead_bytes=5 * KIB)
    d0["total_bytes"] = d0["reserved_peak_bytes"] + 5 * KIB
    memory = _axes(_picture(changed, capacity="64KiB"))[1]
    assert _stacks(memory)[0] == [("peak", pytest.approx(d0["peak_memory_bytes"] / KIB)), ("reserved", 2),
                                  ("outside", 5)]
    assert memory.texts[0].get_text() == f"{format_bytes(d0['total_bytes'])}\n{round(100 * d0['total_bytes'] / (64 * KIB))}%"
    labels = _legend(memory)
    assert "tensor peak (the file does not split it)" in labels and "allocator cache (reserved above the peak)" in labels


def test_the_timeline_has_a_box_per_stage_microbatch_and_direction_forward_first(prediction):
    gantt = _axes(_picture(prediction))[2]
    boxes = {p.get_gid(): (p.get_x(), p.get_x() + p.get_width()) for p in gantt.patches}
    assert sorted(boxes) == sorted(f"{k}{j}@{s}" for s in (0, 1) for j in range(4) for k in "FB")
    assert all(boxes[f"F{j}@{s}"][1] <= boxes[f"B{j}@{s}"][0] for s in (0, 1) for j in range(4))
    assert all(boxes[f"F{j}@0"][1] <= boxes[f"F{j}@1"][0] for j in range(4))  # a micro-batch goes down the pipeline
    assert boxes["F0@0"] == (0, 3) and boxes["B0@1"] == (5, 9)  # unit times: 3 layers forward, 2 layers x 2 backward
    assert "unit times" in gantt.get_title()


def test_without_a_prediction_the_mesh_and_timeline_only(prediction):
    assert len(_axes(_picture(None))) == 2


def test_the_png_is_written(prediction, tmp_path):
    out = write_png(_picture(prediction), tmp_path / "plan.png")
    assert len(png(out)) > 20_000


def test_a_prediction_of_other_devices_or_no_prediction_is_refused(prediction):
    plan = Plan.from_dict(PLAN)
    fewer = {**prediction, "devices": prediction["devices"][:4]}
    with pytest.raises(UsageError, match=r"does not match the plan: it has 4 device\(s\) \[0, 1, 2, 3\], the plan 6"):
        plan_memory_from(fewer, plan, "p.json", validation=False)
    with pytest.raises(UsageError, match="is not a prediction \\(it is a plan\\)"):
        plan_memory_from(PLAN, plan, "p.json", validation=False)
    with pytest.raises(UsageError, match="is not a validation"):
        plan_memory_from(prediction, plan, "p.json", validation=True)


def test_an_estimate_of_the_plan_is_drawn_unsplit_and_an_estimate_of_others_refused():
    """``estimate-memory --json``: {"estimates": [{"plan", "devices": [{device, stage, peak_memory_bytes,
    reserved_peak_bytes, overhead_bytes, total_bytes}]}]} (workflows/estimate_memory.py ``PlanEstimate.to_dict``)."""
    devices = [{"device": d, "stage": 0 if d < 4 else 1, "peak_memory_bytes": (10 + d) * KIB,
                "reserved_peak_bytes": (12 + d) * KIB, "overhead_bytes": 3 * KIB, "total_bytes": (15 + d) * KIB}
               for d in range(6)]
    other = {**PLAN, "num_microbatches": 2}
    doc = {"estimates": [{"plan": other, "devices": devices}, {"plan": PLAN, "devices": devices}]}
    memory = plan_memory_from(doc, Plan.from_dict(PLAN), "e.json", validation=False)
    assert [b.segments for b in memory.bars][5] == (("peak", 15 * KIB), ("reserved", 2 * KIB), ("outside", 3 * KIB))
    assert [b.total for b in memory.bars] == [(15 + d) * KIB for d in range(6)]
    with pytest.raises(UsageError, match="holds 1 estimated plan\\(s\\), none of them the plan"):
        plan_memory_from({"estimates": doc["estimates"][:1]}, Plan.from_dict(PLAN), "e.json", validation=False)

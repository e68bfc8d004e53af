"""benchmarks/extension_gain: which profiles a model's columns may use, the widths the largest-model search grows,
and that search's bookkeeping (its probes faked: a real probe profiles a model, minutes even for a tiny one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan, StagePlan
from hybridplan.profiling.store import ProfileStore
from hybridplan.workflows.runs import ResultStore

from benchmarks.extension_gain import largest as largest_module
from benchmarks.extension_gain.largest import largest
from benchmarks.extension_gain.settings import MEGATRON, SETTINGS, Setting, profile_commands, spaces, uniform_baselines, usable
from benchmarks.extension_gain.widths import at_width, width_of
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.largest_model.search import widest, widest_guided
from benchmarks.paper_profiles import Case


def gpt_tiny_parameters(h: int) -> int:
    """gpt-tiny's parameters at hidden size ``h``, by hand: 8 blocks of 2 LayerNorms (4h), q/k/v (3h^2 + 3h),
    the projection (h^2 + h), the MLP (4h^2 + 4h and 4h^2 + h); token (vocab 128) and position (seq 16)
    embeddings; the head's LayerNorm (2h) and its bias-free unembedding (128h)."""
    return 8 * (12 * h * h + 13 * h) + (128 + 16) * h + 2 * h + 128 * h


def setting(tmp_path: Path, recompute: tuple[str, ...] = ("pipeline", "all")) -> Setting:
    return Setting(Case("gpt-tiny", "1x2", 8, 2, "fp32"), zero=(), recompute=recompute, work=tmp_path)


def make_profile(db: Path, complete: bool) -> None:
    with ProfileStore(db) as store:
        store.set_meta("model", "gpt-tiny")
        if complete:
            store.set_meta("complete", True)


@pytest.mark.parametrize(("limit", "low", "high", "step", "expected"), [
    (100, 32, 256, 32, 96),   # 96 fits, 128 does not
    (100, 128, 256, 32, 0),   # the smallest does not fit
    (300, 32, 256, 32, 256),  # the largest fits: "at least"
    (64, 64, 64, 32, 64),     # one width
    (100, 40, 256, 32, 96),   # low rounded up to a multiple of the step (64)
])
def test_widest_is_the_largest_multiple_that_fits(limit: int, low: int, high: int, step: int, expected: int) -> None:
    probed: list[int] = []

    def fits(w: int) -> bool:
        probed.append(w)
        return w <= limit

    assert widest(fits, low, high, step) == expected
    assert all(w % step == 0 and low <= w <= high for w in probed)
    assert len(probed) == len(set(probed))  # no width probed twice


def test_widest_probes_logarithmically() -> None:
    probed: list[int] = []

    def fits(w: int) -> bool:
        probed.append(w)
        return w <= 777

    assert widest(fits, 1, 1024, 1) == 777
    assert len(probed) <= 2 + 10  # the two ends, then log2(1023) halvings


@settings(max_examples=300, deadline=None)
@given(low=st.integers(1, 40), span=st.integers(0, 200), step=st.integers(1, 9), a=st.floats(0, 1e3),
       b=st.floats(0, 1e3), c=st.floats(0, 10), capacity=st.floats(0, 4e5), noisy=st.booleans(), blind=st.booleans())
def test_the_guided_search_answers_what_the_binary_search_does(low: int, span: int, step: int, a: float, b: float,
                                                               c: float, capacity: float, noisy: bool,
                                                               blind: bool) -> None:
    """Whatever the needs say (a smooth growth, a jagged one, none), the guided search finds the widest width
    that fits, as the plain binary search does, and probes no width twice."""
    def need(w: int) -> float:
        return a + b * w + c * w * w + (37.0 * (w % 3) if noisy else 0.0)  # jagged: not monotone
    def fits(w: int) -> bool:
        return all(need(v) <= capacity for v in range(1, w + 1))  # monotone even where need() is not

    probed: list[int] = []

    def probe(w: int) -> tuple[bool, float | None]:
        probed.append(w)
        return fits(w), None if blind else need(w)

    high = low + span
    expected = widest(fits, low, high, step) if -(-low // step) <= high // step else None
    if expected is None:
        with pytest.raises(ValueError):
            widest_guided(probe, low, high, step, capacity)
        return
    assert widest_guided(probe, low, high, step, capacity) == expected
    probed.clear()  # the widths that do not fit say no need (their plans could not be predicted)
    blind_misses = lambda w: (fits(w), need(w) if fits(w) and not blind else None)  # noqa: E731
    assert widest_guided(lambda w: (probed.append(w), blind_misses(w))[1], low, high, step, capacity) == expected
    assert len(probed) == len(set(probed)) and all(w % step == 0 and low <= w <= high for w in probed)


def test_the_guided_search_needs_fewer_probes_on_a_smooth_growth() -> None:
    """Needs growing as a + b w + c w^2 (parameters as the width squared, activations linearly): after the two
    ends the guess lands next to the limit, where the binary search halves 1023 widths ten times; where the
    widths that do not fit say no need, the guesses extrapolate from those that fit."""
    probed: list[int] = []

    def probe(w: int) -> tuple[bool, float | None]:
        probed.append(w)
        need = 5e8 + 3e5 * w + 900.0 * w * w
        return need <= 1.2e9, need

    found = widest_guided(probe, 1, 1024, 1, 1.2e9)
    assert found == max(w for w in range(1, 1025) if 5e8 + 3e5 * w + 900.0 * w * w <= 1.2e9)
    assert len(probed) <= 2 + 4
    probed.clear()

    def blind_above(w: int) -> tuple[bool, float | None]:
        fits, need = probe(w)
        return fits, need if fits else None

    assert widest_guided(blind_above, 1, 1024, 1, 1.2e9) == found
    assert len(probed) <= 2 + 6


def test_a_guess_within_a_step_of_the_widest_fit_is_taken_after_the_guesses_stall() -> None:
    """MoE 1.3B's extended space (27 Nov): 8.70 GiB at 768, 50.37 at 3,520, then 3,072, 3,136 and 3,152 fitted
    (38.37, 39.60, 39.92 GiB), each guess just below the limit, so the guesses had stopped halving the bracket and
    the search bisected to 3,328. With 3,168 at 40.24 GiB (the line through the last two), the next probe is 3,168,
    which ends the search."""
    import numpy as np

    gib = 2**30
    points = {768: 8.70, 3072: 38.37, 3136: 39.60, 3152: 39.92, 3168: 40.24, 3520: 50.37}
    probed: list[int] = []

    def probe(w: int) -> tuple[bool, float | None]:
        probed.append(w)
        need = float(np.interp(w, list(points), list(points.values()))) * gib
        return need <= 40 * gib, need

    assert widest_guided(probe, 768, 3840, 16, 40 * gib) == 3152
    assert probed == [768, 3520, 3072, 3136, 3152, 3168]  # the line through the origin first: 768 x 40 / 8.70


def test_needs_that_do_not_grow_aim_by_the_brackets_ends() -> None:
    """GPT-3 2.6B's uniform plans (27 Nov): 39.47 GiB at 5,056, 34.48 at 5,152 (another shape), 59.04 at 7,680;
    the parabola through the three crossed 40 GiB near 7,373 and the search probed 7,360, then 7,104. Through the
    bracket's ends, ``a + c w^2``: w = sqrt(5152^2 + (40 - 34.48) (7680^2 - 5152^2) / (59.04 - 34.48)) = 5,816.7."""
    from benchmarks.largest_model.search import _guess

    gib = 2**30
    needs = {5056: 39.47 * gib, 5152: 34.48 * gib, 7680: 59.04 * gib}
    expected = (5152**2 + (40 - 34.48) * (7680**2 - 5152**2) / (59.04 - 34.48)) ** 0.5
    assert abs(expected - 5816.7) < 0.1
    assert _guess(needs, 5152, 7680, 40 * gib) == pytest.approx(expected, rel=1e-9)
    # growing needs keep the parabola through the three nearest
    grow = {5056: 30.0 * gib, 5152: 34.48 * gib, 7680: 59.04 * gib}
    assert _guess(grow, 5152, 7680, 40 * gib) != pytest.approx(_guess({5152: grow[5152], 7680: grow[7680]}, 5152, 7680, 40 * gib))


def test_the_top_width_is_not_probed_where_the_needs_place_the_limit_below_it() -> None:
    """A search resumed above two widths that fit (GPT-3 2.6B's extended space: 9.71 GiB at 2,560, 37.56 GiB at
    7,680) goes to where their curve meets the capacity, never to the top (4 times the width: the dearest
    profile); with the model's own width alone known, the first guess is the line through the origin."""
    gib = 2**30
    a, c = 6.0 * gib, (37.56 - 9.71) * gib / (7680**2 - 2560**2)  # a + c w^2 through the two, a little lower

    probed: list[int] = []

    def probe(w: int) -> tuple[bool, float | None]:
        probed.append(w)
        return a + c * w * w <= 40 * gib, a + c * w * w

    limit = max(w for w in range(7680, 10241, 32) if a + c * w * w <= 40 * gib)  # by hand: 7,968 (a little over)
    found = widest_guided(probe, 7680, 10240, 32, 40 * gib, known={2560: 9.71 * gib, 7680: 37.56 * gib})
    assert found == limit and 10240 not in probed and len(probed) <= 1 + 3
    probed.clear()
    # one need known: 9.71 GiB at 2,560 puts the line through the origin at 2,560 x 40 / 9.71 = 10,545, above the
    # top: the top is probed (and does not fit), then the bracket
    assert widest_guided(probe, 2560, 10240, 32, 40 * gib, known={2560: 9.71 * gib}) == limit
    assert probed[:2] == [2560, 10240]
    probed.clear()
    # at 20 GiB the line meets 40 GiB at twice the width: probed first, under the top
    assert widest_guided(lambda w: (probed.append(w), (w <= 3000, 20 * gib * (w / 2560) ** 2))[1], 2560, 10240, 32,
                         40 * gib, known={2560: 20 * gib}) == 2976
    assert probed[1] == 5120 and 10240 not in probed


def test_widths_grow_only_the_width() -> None:
    assert width_of("gpt-tiny") == (64, 4) and width_of("wresnet-1b") == (320, 32) and width_of("moe-1.3b") == (768, 16)
    assert at_width("gpt-tiny", 64) == "gpt-tiny"
    assert get_model(at_width("gpt-tiny", 64)).parameter_count() == gpt_tiny_parameters(64) == 417_408
    wider = get_model(at_width("gpt-tiny", 128))
    assert wider.parameter_count() == gpt_tiny_parameters(128)
    assert wider.num_layers == get_model("gpt-tiny").num_layers
    with pytest.raises(SystemExit, match="multiple of 4"):
        at_width("gpt-tiny", 66)


def gpt3_parameters(h: int) -> int:
    """GPT-3 2.6B's or 6.7B's parameters at hidden size ``h`` (gpt_tiny_parameters' sums for 32 blocks, vocabulary
    51,200 and sequence 1,024)."""
    return 32 * (12 * h * h + 13 * h) + (51200 + 1024) * h + 2 * h + 51200 * h


def test_gpt3_2p6b_and_6p7b_are_one_model_at_every_width() -> None:
    """[Note: twins share their widths]: they differ in the hidden size only; at a width of neither, a probe of
    either is the first twin's model; at a twin's own width, that twin's own profile; a setting that trains
    differently has no twin."""
    from dataclasses import replace

    from benchmarks.extension_gain.largest import probe_setting, twins
    from benchmarks.extension_gain.widths import same_but_width

    assert same_but_width("gpt3-2.6b", "gpt3-6.7b") and not same_but_width("gpt3-1.3b", "gpt3-2.6b")
    assert not same_but_width("gpt3-2.6b", "moe-1.3b") and not same_but_width("gpt3-2.6b", "resnet-50")
    big = SETTINGS["gpt3-6.7b"]
    assert twins(big) == twins(SETTINGS["gpt3-2.6b"]) == ["gpt3-2.6b", "gpt3-6.7b"] and twins(SETTINGS["moe-1.3b"]) == ["moe-1.3b"]
    wider = probe_setting(big, 7680)
    assert wider.case.model == at_width("gpt3-2.6b", 7680) and wider.db.parent == big.work / "largest"
    assert get_model(wider.case.model).parameter_count() == gpt3_parameters(7680) == 23_446_748_160
    assert probe_setting(big, 2560).db == SETTINGS["gpt3-2.6b"].db and probe_setting(big, 4096) == big
    alone = replace(big, case=replace(big.case, global_batch_size=512))
    assert twins(alone) == ["gpt3-6.7b"] and probe_setting(alone, 7680).case.model == at_width("gpt3-6.7b", 7680)


def test_a_twins_search_starts_from_the_other_twins_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """GPT-3 6.7B's search (from 4,096 to 3 times it) after 2.6B's (from 2,560 to 1.75 times it) in one results
    file: the widths 2.6B probed between 4,096 and 12,288 are 6.7B's too (``from`` 2.6B); 6.7B's own probes are
    only wider ones, profiled under 2.6B's names; the probes table says whose probe."""
    from dataclasses import replace

    from benchmarks.extension_gain.tables import print_tables

    calls: list[str] = []

    def answer(s: Setting, space: str, cluster: Any, say: Any) -> dict[str, Any]:
        calls.append(s.case.model)
        n = get_model(s.case.model).parameter_count()
        return {"fits": n <= gpt3_parameters(5000), "needed_bytes": n}

    monkeypatch.setattr(largest_module, "answer", answer)
    monkeypatch.setattr(largest_module, "ensure_profiles", lambda *args: None)
    store = ResultStore(tmp_path / "r.json")
    for model, factor in (("gpt3-2.6b", 1.75), ("gpt3-6.7b", 3)):
        s = replace(SETTINGS[model], work=tmp_path)
        largest(s, store, lambda _: None, profile=False, spaces_searched=("capture",), high_factor=factor)
    small, big = store["gpt3-2.6b/largest/capture"], store["gpt3-6.7b/largest/capture"]
    assert small["widest"] == 4480 and small["at_least"]  # 1.75 x 2,560: every width fits
    assert big["widest"] == 4992 and not big["at_least"]  # the widest multiple of 32 heads up to 5,000
    shared = {w for w in small["probes"] if 4096 <= int(w) <= 12288}
    assert shared and all(big["probes"][w]["from"] == "gpt3-2.6b" for w in shared)
    own = [w for w in big["probes"] if "from" not in big["probes"][w]]
    assert own and not shared & set(own) and min(map(int, own)) > 4480  # (fitting is monotone: 4,480 fits)
    print_tables(store)
    assert "| gpt3-6.7b | capture | 4480 | 8,172,245,760 | yes (gpt3-2.6b's probe) |" in capsys.readouterr().out
    assert calls[len(small["probes"]):] == [at_width("gpt3-2.6b", int(w)) if w != "4096" else "gpt3-6.7b" for w in own]


def test_a_model_whose_profile_is_unfinished_is_skipped_with_the_reason(tmp_path: Path) -> None:
    s = setting(tmp_path)
    ready, notes = usable(s)
    assert ready is None and notes == [f"gpt-tiny skipped: no profile yet ({s.db.name})"]
    make_profile(s.db, complete=False)
    ready, notes = usable(s)
    assert ready is None and "profile unfinished" in notes[0] and "resumes" in notes[0]


def test_unfinished_recompute_profiles_leave_out_their_rows(tmp_path: Path) -> None:
    s = setting(tmp_path)
    make_profile(s.db, complete=True)
    pipeline, every = s.recompute_dbs
    make_profile(pipeline, complete=True)
    make_profile(every, complete=False)
    ready, notes = usable(s)
    assert ready is not None and ready.recompute == ("pipeline",) and ready.recompute_db == pipeline
    assert len(notes) == 1 and "recompute (all) rows skipped" in notes[0]


def test_the_paper_size_bf16_settings_search_zero1_last_and_the_uniform_plans_with_and_without_it() -> None:
    """ZeRO-1 is the last row of the extended space (the whole extension with ZeRO-1 data stages), the rows before
    it unchanged (no ZeRO); the uniform baseline is taken both ways; their profiles need no ZeRO-3 scenarios."""
    for name in ("moe-1.3b", "wresnet-1b", "gpt3-2.6b", "gpt3-6.7b"):
        s = SETTINGS[name]
        rows = spaces(s)
        assert list(rows) == ["capture", "+ data x tensor", "+ across nodes", "+ recompute (single-device stages)",
                              "+ recompute (every stage kind)", "+ ZeRO-1"]
        assert all("zero" not in options for options in list(rows.values())[:-1])
        assert rows["+ ZeRO-1"] == {"composite": True, "cross_node": True, "recompute_db": s.recompute_dbs[1], "zero": True}
        assert uniform_baselines(s) == {MEGATRON: 0, "megatron-3d + ZeRO-1": 1}
        assert not any("--zero" in argv for argv in profile_commands(s))


def test_zero_levels_of_a_setting(tmp_path: Path) -> None:
    """No ZeRO: no ZeRO row, one uniform baseline; ZeRO-2/3: the profile gets the ZeRO-3 scenarios; levels out of
    order or outside 1-3 are refused."""
    plain = setting(tmp_path)
    assert plain.zero_space is None and uniform_baselines(plain) == {MEGATRON: 0}
    assert not any("zero" in options for options in spaces(plain).values())
    every = Setting(Case("gpt-tiny", "1x2", 8, 2, "fp32"), zero=(1, 2, 3), recompute=(), work=tmp_path)
    assert list(spaces(every))[-1] == "+ ZeRO-1/2/3" and spaces(every)["+ ZeRO-1/2/3"]["zero"] is True
    assert profile_commands(every)[0][-1] == "--zero"
    for precision, zero in (("fp32", (3, 1)), ("fp32", (1, 1)), ("fp32", (4,)), ("fp32", (0,))):
        with pytest.raises(SystemExit, match="ZeRO"):
            Setting(Case("gpt-tiny", "1x2", 8, 2, precision), zero=zero, recompute=())
    assert Setting(Case("gpt-tiny", "1x2", 8, 2, "bf16"), zero=(1, 3), recompute=()).zero_space == "+ ZeRO-1/3"
    bf16 = Setting(Case("gpt-tiny", "1x2", 8, 2, "bf16"), zero=(1, 2, 3), recompute=())  # predicted in bf16 too
    assert bf16.zero_space == "+ ZeRO-1/2/3" and bf16.zero_scenarios


def test_an_answer_outside_the_settings_zero_levels_is_named() -> None:
    """The memory search shards at every level the profile predicts; an answer with a ZeRO-3 stage (MoE 1.3B's
    profile has old data2-zero3 runs) is not a ZeRO-1 setting's."""
    s = SETTINGS["moe-1.3b"]

    def plan(zero: int) -> Plan:
        return Plan(schedule="1f1b", global_batch_size=512, num_microbatches=16,
                    stages=(StagePlan(0, 9, "data", 2, (0, 1), zero=zero), StagePlan(9, 18, "none", 1, (2,))))

    assert s.unsearched_zero(plan(0)) is None and s.unsearched_zero(plan(1)) is None
    assert s.unsearched_zero(plan(3)) == "the search chose stage [0,9) ZeRO-3, outside this setting's ZeRO levels [1]"


def test_largest_searches_the_width_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A space whose plans fit while the model has at most gpt_tiny_parameters(150) parameters: the widest
    multiple of 4 below 150 is 148 (by hand); a second search probes nothing again."""
    calls: list[tuple[str, str]] = []

    def answer(s: Setting, space: str, cluster: Any, say: Any) -> dict[str, Any]:
        calls.append((s.case.model, space))
        return {"fits": get_model(s.case.model).parameter_count() <= gpt_tiny_parameters(150), "needed_bytes": 1}

    monkeypatch.setattr(largest_module, "answer", answer)
    monkeypatch.setattr(largest_module, "ensure_profiles", lambda *args: None)
    store = ResultStore(tmp_path / "r.json")
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",))
    r = ResultStore(tmp_path / "r.json")["gpt-tiny/largest/capture"]
    assert r["widest"] == 148 and r["parameters"] == gpt_tiny_parameters(148) and not r["at_least"]
    assert r["probes"]["152"]["fits"] is False and r["high"] == 256
    probed = len(calls)
    assert probed == len(r["probes"]) <= 2 + 6  # 48 steps of 4 between 64 and 256
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",))
    assert len(calls) == probed


def test_a_wider_search_starts_from_what_a_narrower_one_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to twice gpt-tiny's width (128) every width fits: "at least 128"; asked again up to 4 times, the search
    probes only above 128 (fitting is monotone) and finds 148 as a search from scratch does."""
    probed: list[int] = []

    def answer(s: Setting, space: str, cluster: Any, say: Any) -> dict[str, Any]:
        h = int(s.case.model.rpartition("_w")[2]) if "_w" in s.case.model else 64
        probed.append(h)
        n = get_model(s.case.model).parameter_count()
        return {"fits": n <= gpt_tiny_parameters(150), "needed_bytes": n}

    monkeypatch.setattr(largest_module, "answer", answer)
    monkeypatch.setattr(largest_module, "ensure_profiles", lambda *args: None)
    store = ResultStore(tmp_path / "r.json")
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",), high_factor=2)
    r = store["gpt-tiny/largest/capture"]
    assert r["widest"] == 128 and r["at_least"]
    probed.clear()
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",), high_factor=4)
    r = store["gpt-tiny/largest/capture"]
    assert r["widest"] == 148 and not r["at_least"] and r["high"] == 256
    assert probed and min(probed) > 128


def test_a_probe_without_its_profile_is_not_run(tmp_path: Path) -> None:
    """Without --profile a missing profile stops the search: the column names the profile and its command."""
    store = ResultStore(tmp_path / "r.json")
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture", "extended"))
    for space in ("capture", "extended"):
        r = store[f"gpt-tiny/largest/{space}"]
        assert "widest" not in r and r["probes"] == {}
        assert "no profile yet (gpt-tiny-1x2-b8-m2-fp32.sqlite)" in r["not run"]
        assert "hybridplan profile --model gpt-tiny" in r["not run"]


def fake_probes_and_runs(monkeypatch: pytest.MonkeyPatch, simulate: Callable[..., dict[str, Any]],
                         asked: list[str], refused: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Probes answered without profiles (a gpt-tiny width fits up to gpt_tiny_parameters(150), its plan data2,
    except the models in ``refused``; each probed model appended to ``asked``) and answers run by ``simulate``."""
    plan = {"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 2,
            "stages": [{"layers": [0, 10], "parallelism": "data", "degree": 2, "devices": [0, 1]}]}

    def answer(s: Setting, space: str, cluster: Any, say: Any) -> dict[str, Any]:
        asked.append(s.case.model)
        n = get_model(s.case.model).parameter_count()
        fits = n <= gpt_tiny_parameters(150) and s.case.model not in refused
        return {"fits": fits, "needed_bytes": n, **({"label": "data2", "plan": plan} if fits else {})}

    monkeypatch.setattr(largest_module, "answer", answer)
    monkeypatch.setattr(largest_module, "ensure_profiles", lambda *args: None)
    monkeypatch.setattr(largest_module, "simulate", simulate)


def test_the_answer_is_run_on_simulated_devices_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """With ``validate`` the plan found at the widest width runs on simulated devices of the capacity (its
    status and measured peak kept in that probe, and shown); a search resumed later runs nothing again; a probe
    of an earlier search that kept no plan is asked again for it."""
    from benchmarks.extension_gain.tables import print_tables

    asked: list[str] = []
    ran: list[tuple[str, Any]] = []

    def simulate(s: Setting, p: Plan, cluster: Any, recompute_db: Any = None) -> dict[str, Any]:
        ran.append((s.case.model, cluster.memory_of(0)))
        return {"status": "ok", "reason": None, "measured_peak_bytes": 3 * 2**30, "predicted_peak_bytes": 3 * 2**30,
                "seconds": 1.0, "devices": []}

    refused: set[str] = set()
    fake_probes_and_runs(monkeypatch, simulate, asked, refused)
    store = ResultStore(tmp_path / "r.json")
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",), validate=True)
    r = ResultStore(tmp_path / "r.json")["gpt-tiny/largest/capture"]
    assert r["widest"] == 148 and r["probes"]["148"]["simulated"]["status"] == "ok"
    assert ran == [(at_width("gpt-tiny", 148), 40 * 2**30)]  # the answer's model, on 40 GiB devices
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",), validate=True)
    assert len(ran) == 1
    print_tables(store)
    assert "| data2 | 2.06 MiB | ok, 3.00 GiB | " in capsys.readouterr().out  # (needs: the faked parameter count)
    # an earlier search's answer without its plan: asked again, then run
    record = store["gpt-tiny/largest/capture"]
    del record["probes"]["148"]["plan"], record["probes"]["148"]["simulated"]
    store.put("gpt-tiny/largest/capture", record)
    asked.clear()
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",), validate=True)
    assert asked == [at_width("gpt-tiny", 148)] and len(ran) == 2
    # asked again (its profile made again by a later version), 148 no longer fits: the search goes on below it
    record = store["gpt-tiny/largest/capture"]
    del record["probes"]["148"]["plan"], record["probes"]["148"]["simulated"]
    store.put("gpt-tiny/largest/capture", record)
    asked.clear()
    refused.add(at_width("gpt-tiny", 148))
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",), validate=True)
    r = store["gpt-tiny/largest/capture"]
    assert r["widest"] == 144 and r["probes"]["148"]["fits"] is False and r["probes"]["144"]["simulated"]["status"] == "ok"
    assert "label" not in r["probes"]["148"] and "plan" not in r["probes"]["148"]
    assert asked[0] == at_width("gpt-tiny", 148) and ran[-1][0] == at_width("gpt-tiny", 144)  # (then probes below 148)


def test_an_answer_that_runs_out_of_memory_is_refuted_and_the_search_goes_on_below_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """[Note: an answer refuted by its run]: every width up to 148 is predicted to fit, but 148's plan runs out of
    memory on the simulated devices and 144's runs: the answer is 144, 148 kept as not fitting with the run's
    reason (and so shown); searched again, nothing runs again."""
    from benchmarks.extension_gain.tables import print_tables

    ran: list[str] = []

    def simulate(s: Setting, p: Plan, cluster: Any, recompute_db: Any = None) -> dict[str, Any]:
        ran.append(s.case.model)
        oom = s.case.model == at_width("gpt-tiny", 148)
        return {"status": "oom" if oom else "ok", "reason": "device 1 (stage 0): out of memory" if oom else None,
                "measured_peak_bytes": None if oom else 2**30, "predicted_peak_bytes": 2**30, "seconds": 1.0}

    fake_probes_and_runs(monkeypatch, simulate, [])
    store = ResultStore(tmp_path / "r.json")
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",), validate=True)
    r = ResultStore(tmp_path / "r.json")["gpt-tiny/largest/capture"]
    assert r["widest"] == 144 and r["parameters"] == gpt_tiny_parameters(144)
    assert r["probes"]["148"]["fits"] is False and r["probes"]["148"]["refuted"] == "device 1 (stage 0): out of memory"
    assert r["probes"]["144"]["simulated"]["status"] == "ok"
    assert ran == [at_width("gpt-tiny", 148), at_width("gpt-tiny", 144)]
    largest(setting(tmp_path), store, lambda _: None, profile=False, spaces_searched=("capture",), validate=True)
    assert len(ran) == 2 and store["gpt-tiny/largest/capture"]["widest"] == 144
    print_tables(store)
    shown = capsys.readouterr().out
    assert "| gpt-tiny | capture | 148 | " in shown and "| no: predicted to fit, out of memory when run |" in shown
    assert "| gpt-tiny | capture | 144 (hidden size; own 64) | " in shown


def test_searches_run_side_by_side_merge_into_one_results_file(tmp_path: Path) -> None:
    """--merge copies the largest-model records of each file (a later file winning a key), nothing else; a file
    that cannot be read stops the merge before anything is written."""
    from benchmarks.extension_gain.run import merge_largest

    a, b = ResultStore(tmp_path / "a.json"), ResultStore(tmp_path / "b.json")
    a.put("m/largest/capture", {"widest": 1})
    a.put("m/peak/capture", {"label": "not copied"})
    b.put("m/largest/capture", {"widest": 2})
    b.put("n/largest/extended", {"widest": 3})
    main = ResultStore(tmp_path / "results.json")
    main.put("m/peak/capture", {"label": "kept"})
    assert merge_largest(main, [a.path, b.path]) == ["m/largest/capture", "n/largest/extended"]
    again = ResultStore(tmp_path / "results.json").records
    assert again == {"m/peak/capture": {"label": "kept"}, "m/largest/capture": {"widest": 2},
                     "n/largest/extended": {"widest": 3}}
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="bad.json is not a results file"):
        merge_largest(main, [a.path, tmp_path / "bad.json"])
    with pytest.raises(SystemExit, match="missing.json does not exist"):
        merge_largest(main, [a.path, tmp_path / "missing.json"])
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(SystemExit, match="cannot read .*broken.json"):
        merge_largest(main, [tmp_path / "broken.json"])
    assert ResultStore(tmp_path / "results.json").records == again


@pytest.mark.slow  # profiles gpt-tiny at about 6 widths on simulated devices: minutes on 2 cores
def test_largest_on_a_tiny_model_runs_within_the_capacity(tmp_path: Path) -> None:
    """The real search (profiles of each probed width, the space's solver): the widest plan found for CAPTURE's
    space runs on simulated devices of that capacity (measured, not predicted), and the next width was refused.
    1.9 GiB: gpt-tiny's own width needs 1.85 GiB on 1x2 CUDA devices (most of it what CUDA holds outside the
    allocator), so the limit falls inside the searched widths."""
    from hybridplan.plan import Cluster, Plan
    from hybridplan.workflows.plan_memory import plan_memory
    from hybridplan.workflows.runs import measure_plan

    s = setting(tmp_path, recompute=())
    store = ResultStore(tmp_path / "r.json")
    largest(s, store, lambda _: None, profile=True, capacity="1.9GiB", spaces_searched=("capture",))
    r = store["gpt-tiny/largest/capture"]
    w = r["widest"]
    assert 64 <= w < 256 and r["probes"][str(w)]["fits"]
    assert str(w + 4) in r["probes"] and not r["probes"][str(w + 4)]["fits"]
    wide = largest_module.probe_setting(s, w)
    cluster = Cluster.parse("1x2", device_memory="1.9GiB")
    plan: Plan = plan_memory(wide.db, cluster).plan
    ran = measure_plan(wide.db, plan, cluster=cluster, backend="sim", model=wide.case.model)
    assert ran.status == "ok", ran.reason


def test_the_largest_model_tables_show_finished_and_unfinished_searches(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A finished search prints its widest width; an interrupted one the bracket its probes give (the widest
    fit, the narrowest miss above it); every probe gets a row, a miss without a predicted need a blank need."""
    from benchmarks.extension_gain.tables import print_tables

    store = ResultStore(tmp_path / "r.json")
    probe = lambda w, fits, need: {"width": w, "parameters": 1000 * w, "fits": fits, "needed_bytes": need,  # noqa: E731
                                   "label": f"plan{w}" if fits else None}
    store.put("m/largest/capture", {"probes": {"64": probe(64, True, 2**30), "256": probe(256, False, None),
                                               "128": probe(128, True, 3 * 2**30), "192": probe(192, False, 5 * 2**30)},
                                    "widest": 128, "at_least": False, "own_width": 64, "width_name": "hidden size",
                                    "parameters": 128_000, "label": "plan128"})
    store.put("m/largest/extended", {"probes": {"64": probe(64, True, 2**30), "256": probe(256, False, None),
                                                "160": probe(160, True, 2**31)}})
    print_tables(store)
    out = capsys.readouterr().out
    assert "| m | capture | 128 (hidden size; own 64) | 128,000 | plan128 | 3.00 GiB |  | 4 |" in out
    assert "| m | extended | search unfinished: 160 fits, 256 does not | 160,000 | plan160 | 2.00 GiB |  | 3 |" in out
    assert "| m | capture | 256 | 256,000 | no |  |  |" in out and "| m | capture | 192 | 192,000 | no | 5.00 GiB |  |" in out

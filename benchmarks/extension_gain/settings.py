"""The models compared, their profiles (the ``hybridplan profile`` commands that make them, and whether each has
finished), and the plan spaces searched on them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.paper_profiles import CAPACITY, Case

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
"""The repository root (the results file names profiles relative to it)."""
WORK = HERE / "work"
MEGATRON = "megatron-3d"
"""The uniform 3D baseline's key (without ZeRO; with ZeRO-1 it is ``"megatron-3d + ZeRO-1"``: :func:`uniform_baselines`)."""


@dataclass(frozen=True)
class Setting:
    """A model's case, and which extra profiles it gets (ZeRO-3 scenarios; a recompute profile's scenarios)."""

    case: Case
    zero: tuple[int, ...]
    """The ZeRO levels searched (of 1, 2, 3; none: ``()``): the extended space's last row adds the data stages
    sharded at these levels (:func:`spaces`), and the uniform 3D baseline is also taken with ZeRO-1 where 1 is
    among them (:func:`uniform_baselines`). ZeRO-2 and ZeRO-3 are predicted from the ``data<d>-zero3`` scenarios,
    which the profile then gets (``profile --zero``: up to twice the runs); ZeRO-1 needs none (predict/zero_layout.py).
    The paper-size bf16 settings search ZeRO-1 only: their profiles were taken without those scenarios (doubling
    them was not worth it); ZeRO-2/3 data x tensor stages, composed from the tensor stage, are predicted without
    them (in mixed precision too since 27 Nov), so the memory search may choose them (``unsearched_zero``)."""
    recompute: tuple[str, ...]
    """Recompute profiles, each "all" (every scenario) or its scenarios ("pipeline": recompute is then predicted
    for single-device stages only); the last is the extended space's."""
    work: Path = WORK
    """Where the profiles are (tests point it at a temporary folder)."""

    def __post_init__(self) -> None:
        if list(self.zero) != sorted(set(self.zero)) or not set(self.zero) <= {1, 2, 3}:
            raise SystemExit(f"{self.case.model}: ZeRO levels {self.zero!r}: give distinct levels of 1, 2, 3 in order")

    @property
    def zero_space(self) -> str | None:
        """The key of the extended space's ZeRO row (``"+ ZeRO-1"``, ``"+ ZeRO-1/2/3"``), None without ZeRO."""
        return f"+ ZeRO-{'/'.join(map(str, self.zero))}" if self.zero else None

    @property
    def zero_scenarios(self) -> bool:
        """Whether the profile gets the ``data<d>-zero3`` scenarios (``profile --zero``): ZeRO-2 and ZeRO-3 need them."""
        return any(z >= 2 for z in self.zero)

    def unsearched_zero(self, plan: Any) -> str | None:
        """Why ``plan`` (a search's answer) lies outside this setting's space, or None. The memory search shards
        data stages at every level the profile predicts (``--zero``); an answer is kept only at the setting's
        levels. (MoE 1.3B's profile holds 12 ``data2-zero3`` runs taken before the runtime sharded in bf16: they
        are not used.) The lowest answer of that larger space, if inside the setting's, is also its lowest."""
        off = [f"stage [{st.start},{st.stop}) ZeRO-{st.zero}" for st in plan.stages if st.zero and st.zero not in self.zero]
        return (f"the search chose {', '.join(off)}, outside this setting's ZeRO levels {list(self.zero)}"
                if off else None)

    @property
    def db(self) -> Path:
        c = self.case
        name = c.model.rsplit(":", 1)[-1]  # a user model (a wider one: widths.py) by its function's name
        return self.work / f"{name}-{c.mesh}-b{c.global_batch_size}-m{c.num_microbatches}-{c.precision}.sqlite"

    @property
    def recompute_db(self) -> Path | None:
        """The extended space's recompute profile (None: none)."""
        return self.recompute_dbs[-1] if self.recompute else None

    @property
    def recompute_dbs(self) -> list[Path]:
        return [self.db.with_name(self.db.stem + ("-recompute.sqlite" if r == "pipeline" else f"-recompute-{r}.sqlite"))
                for r in self.recompute]

    def of_model(self, model: str, work: Path) -> Setting:
        """The same setting for another model (a wider one: the largest-model probes), its profiles in ``work``."""
        return replace(self, case=replace(self.case, model=model), work=work)


# Micro-batches of Alpa's suites (GPT: 16 sequences, MoE: 32 sequences) in 16 micro-batches: the peak of a
# 1F1B plan depends on the micro-batch and the in-flight count (at most the stages), not on more micro-batches.
# Every paper-size profile is taken on 40 GiB devices except MoE 1.3B's (taken first, without a capacity). Wide-ResNet 1B is CAPTURE's prediction-accuracy model (benchmarks/paper_profiles.py); it
# is planned for 1F1B here like the others (CAPTURE planned it for GPipe), so that the uniform 3D baseline,
# Megatron's 1F1B, is compared on the same schedule.
SETTINGS: dict[str, Setting] = {
    "moe-1.3b": Setting(Case("moe-1.3b", "4x4", 512, 16, "bf16"), zero=(1,), recompute=("pipeline", "all")),
    "wresnet-1b": Setting(Case("wresnet-1b", "4x4", 256, 16, "bf16", profile_capacity=CAPACITY), zero=(1,),
                          recompute=("pipeline", "all")),
    "gpt3-2.6b": Setting(Case("gpt3-2.6b", "4x4", 256, 16, "bf16", profile_capacity=CAPACITY), zero=(1,),
                         recompute=("pipeline", "all")),
    "gpt3-6.7b": Setting(Case("gpt3-6.7b", "4x4", 256, 16, "bf16", profile_capacity=CAPACITY), zero=(1,),
                         recompute=("pipeline", "all")),
    # a smoke run of the whole script in about a minute (not in the default --models)
    "gpt-tiny": Setting(Case("gpt-tiny", "2x2", 32, 4, "fp32"), zero=(1, 2, 3), recompute=("pipeline",)),
}
DEFAULT_MODELS = ("moe-1.3b", "wresnet-1b", "gpt3-2.6b", "gpt3-6.7b")


def profile_commands(s: Setting) -> list[list[str]]:
    """The ``hybridplan profile`` argument lists that make the setting's profiles (resumable): the profile, then
    each recompute profile."""
    c = s.case
    base = ["profile", "--model", c.model, "--cluster", c.mesh, "--global-batch-size", str(c.global_batch_size),
            "--num-microbatches", str(c.num_microbatches), "--backend", "sim", "--device", "cuda",
            "--precision", c.precision] + (["--device-memory", c.profile_capacity] if c.profile_capacity else [])
    out = [base + ["--db", str(s.db)] + (["--zero"] if s.zero_scenarios else [])]
    for scenarios, db in zip(s.recompute, s.recompute_dbs):
        out.append(base + ["--activation-checkpointing"] + ([] if scenarios == "all" else ["--scenarios", scenarios])
                   + ["--db", str(db)])
    return out


def unfinished(db: Path) -> str | None:
    """Why the profile ``db`` cannot be used yet (not started, or a campaign that has not ended), or None when
    its campaign finished (``profiling/campaign.py`` records "complete" when every run is in)."""
    from hybridplan.profiling.store import ProfileStore

    if not db.exists():
        return f"no profile yet ({db.name})"
    with ProfileStore(db, create=False) as store:
        if store.get_meta("complete"):
            return None
        return f"profile unfinished ({db.name}: {len(store.runs())} runs in; re-running its command resumes it)"


def usable(s: Setting) -> tuple[Setting | None, list[str]]:
    """The setting reduced to its finished profiles, and why each left-out part is left out: None when the
    profile itself is unfinished (the model is skipped); else without the unfinished recompute profiles (their
    rows are skipped, and the extended space uses the last finished one)."""
    why = unfinished(s.db)
    if why is not None:
        return None, [f"{s.case.model} skipped: {why}"]
    keep, notes = [], []
    for scenarios, db in zip(s.recompute, s.recompute_dbs):
        why = unfinished(db)
        if why is None:
            keep.append(scenarios)
        else:
            notes.append(f"{s.case.model}: recompute ({scenarios}) rows skipped: {why}")
    return replace(s, recompute=tuple(keep)), notes


def spaces(s: Setting) -> dict[str, dict[str, Any]]:
    """The memory searches, as :func:`~hybridplan.workflows.plan_memory.plan_memory` options, CAPTURE's first
    and the whole extension last, each adding a dimension to the one before: data x tensor stages, stages across
    nodes, recompute (each recompute profile), ZeRO (the setting's levels; last, as it came last to the bf16
    runtime: the rows before it stay as they were measured)."""
    out: dict[str, dict[str, Any]] = {"capture": {}, "+ data x tensor": {"composite": True},
                                      "+ across nodes": {"composite": True, "cross_node": True}}
    for scenarios, db in zip(s.recompute, s.recompute_dbs):
        which = "every stage kind" if scenarios == "all" else "single-device stages" if scenarios == "pipeline" else scenarios
        out[f"+ recompute ({which})"] = {**out["+ across nodes"], "recompute_db": db}
    if s.zero_space is not None:
        out[s.zero_space] = {**list(out.values())[-1], "zero": True}
    return out


def uniform_baselines(s: Setting) -> dict[str, int]:
    """The uniform 3D baselines' keys and their ZeRO level: without ZeRO, and with ZeRO-1 over each stage's data
    group (Megatron's distributed optimizer) where the setting searches ZeRO-1."""
    return {MEGATRON: 0, **({f"{MEGATRON} + ZeRO-1": 1} if 1 in s.zero else {})}

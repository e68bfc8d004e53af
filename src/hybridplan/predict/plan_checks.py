"""Refusals of the memory predictor: the plans and stages a profile cannot predict, with the error that says why.

A prediction from statistics that do not describe a stage would be silently wrong, so
:meth:`~hybridplan.predict.memory.MemoryPredictor.predict` refuses such a plan with a
:class:`~hybridplan.errors.ProfileError` naming the stage, what is missing and how to get it (profile again,
resume the profile, or count the plan on simulated devices): :func:`check_measured_kinds` before any stage is
predicted (ZeRO the profile cannot model, recompute it did not run), :func:`why_missing` for a stage that came
out unpredictable (a scenario, batch size, weight-stash size or layer the profile lacks), and
:func:`check_same_campaign` for a recompute profile that does not pair with the profile. Kept apart from the
predictor's arithmetic: these are the rules of what a profile covers and the messages a user reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hybridplan.errors import ProfileError
from hybridplan.plan import Plan, StagePlan
from hybridplan.predict.batch_scaling import span_in_units
from hybridplan.predict.zero_stage import tensor_shards
from hybridplan.profiling.quantities import QUANTITIES

if TYPE_CHECKING:
    from hybridplan.predict.memory import MemoryPredictor

__all__ = ["check_measured_kinds", "check_same_campaign", "why_missing"]


def check_measured_kinds(predictor: MemoryPredictor, plan: Plan) -> None:
    """Refuse stages the profile did not measure in kind: ZeRO sharding, selective recompute (never profiled), or
    full recompute asked of a stage when the profile ran without it (their memory differs from what the statistics hold, so a prediction would be
    silently wrong). A profile taken with recompute predicts every stage recomputed, as its runs did."""
    for i, stage in enumerate(plan.stages):
        if stage.recompute == "selective":
            raise ProfileError(
                f"stage {i} ({stage.describe()}) recomputes selectively (torchtitan's per-operation policy): profiles"
                " measure stages with and without full recompute, not this policy",
                fix="count the plan exactly on simulated devices ('hybridplan estimate-memory --plan PLAN', or"
                " 'hybridplan run --backend sim'), or give the stage \"recompute\": \"full\"")
        base = (predictor.recomputed if stage.recompute == "full" and not predictor.recompute and predictor.recomputed
                else predictor)
        if stage.zero:
            _check_zero(i, stage, base)
        if stage.recompute == "full" and not predictor.recompute and predictor.recomputed is None:
            raise ProfileError(
                f"stage {i} ({stage.describe()}) recomputes its activations; the profile was taken without recompute",
                fix="profile the model again with --activation-checkpointing and give that database as"
                " --recompute-db, or drop \"recompute\" from the stage",
            )


def _check_zero(i: int, stage: Any, base: MemoryPredictor) -> None:
    """Refuse a ZeRO stage the profile cannot predict, saying why ([Note: predicting ZeRO from a profile] in
    predict/zero_layout.py)."""
    where = f"stage {i} ({stage.describe()})"
    instead = "count it exactly on simulated devices instead ('hybridplan run --backend sim --plan PLAN ...': no GPU needed)"
    if stage.kind == "data+tensor":
        _check_zero_tensor(where, stage, base)
        return
    if stage.kind != "data":
        raise ProfileError(f"{where}: ZeRO-{stage.zero} of a {stage.kind} stage is not yet predicted from a profile",
                           fix=instead)
    if base.zero_layout is None:
        raise ProfileError(f"{where}: the profile does not record the parameter shapes ZeRO shards",
                           fix="run the same 'hybridplan profile' command on the database again: it resumes and"
                           " records them")
    if stage.zero in (2, 3) and not base.profiled_degrees("data-zero3"):
        micro = sorted({s.microbatch_size for sizes in base.stats.values() for s in sizes})
        profile = "the profile" if base.source is None else f"the profile {base.source!r}"
        raise ProfileError(
            f"{where}: {profile} has no ZeRO-3 scenario (ZeRO-{stage.zero} is predicted from it); it holds"
            f" {', '.join(sorted(f'{k}{d}' if k != 'none' else 'pipeline' for k, d in base.stats))}, profiled at"
            f" micro-batches of {micro} samples",
            fix=f"profile again with --zero and micro-batches that split 2 ways or more (--zero adds data<d>-zero3"
            f" only where every profiled micro-batch does; it says so when it cannot), or " + instead)
    zero3 = base.profiled_degrees("data-zero3")
    if stage.zero == 3 and zero3 and stage.degree > zero3[-1] and base._wider_data("data-zero3", stage.degree) is None:
        raise ProfileError(
            f"{where}: ZeRO-3 over {stage.degree} devices is above the profiled ZeRO-3 degrees {zero3}; it is composed"
            f" from the data{zero3[-1]}-zero3 scenario ([Note: a ZeRO-3 stage wider than the profiled ones]) only by"
            " the default prediction method and where the micro-batch of"
            f" {base.microbatch_size} samples splits {stage.degree} ways",
            fix="predict with the default method and a micro-batch size divisible by the degree, or " + instead)
    wider = base._wider_data("data-zero3", stage.degree) is not None and base._wider_data("data", stage.degree) is not None
    if stage.zero == 2 and not wider and not {("data-zero3", stage.degree), ("data", stage.degree)} <= set(base.stats):
        raise ProfileError(f"{where}: ZeRO-2 is predicted from the data{stage.degree} and data{stage.degree}-zero3"
                           " scenarios, and the profile lacks one (no fit across degrees for ZeRO-2)",
                           fix=f"profile with --zero on a mesh with {stage.degree} devices per node, or " + instead)


def _check_zero_tensor(where: str, stage: StagePlan, base: MemoryPredictor) -> None:
    """Refuse a ZeRO data x tensor stage the profile cannot predict ([Note: ZeRO-1 of a data x tensor stage] in
    predict/zero_layout.py)."""
    t = stage.tensor_degree
    if base.zero_layout is None or (tensor_shards(base, t) is None and t in base.profiled_degrees("tensor")):
        raise ProfileError(f"{where}: the profile does not record the tensor x{t} parameter shards ZeRO shards",
                           fix="run the same 'hybridplan profile' command on the database again: it resumes and"
                           " records them")


def why_missing(predictor: MemoryPredictor, start: int, stop: int, kind: str, degree: int) -> str:
    """Why ``predictor`` cannot predict the stage ``[start, stop)`` as ``kind`` x ``degree``: the scenario or batch
    size the profile lacks, the weight-stash sizes, or the layers its statistics miss or merge (for the error that
    :meth:`~hybridplan.predict.memory.MemoryPredictor.predict` raises)."""
    key = predictor._scenario(kind, degree)
    name = "pipeline" if key[0] == "none" else f"{key[0].split('-')[0]}{key[1]}" + (
        f"-{key[0].split('-')[1]}" if "-" in key[0] else "")
    sizes = predictor.stats.get(key)
    if not sizes:
        profiled = predictor.profiled_degrees(kind)
        if degree > 1 and degree > max(profiled, default=0) and len(profiled) < 2:
            return f"the profile has no {name} statistics, nor {kind} statistics at two degrees to fit it from"
        return f"the profile has no {name} statistics"
    if len(sizes) < 2:
        return f"{name} was profiled at one batch size only"
    stash = predictor._stash
    if stash.sign and stash.apply(np.zeros(len(QUANTITIES)), start, stop, kind, degree) is None:
        return (f"the profile was taken under {predictor.profile_schedule!r} and has no weight-stash sizes for these"
                f" layers to predict {predictor.schedule!r} (run 'hybridplan profile' again on the database: it"
                " resumes and records them)")
    for s in sizes:
        if s.bounds is not None and (start not in s.bounds or stop not in s.bounds):
            return f"{name} was profiled on merged layers starting at {s.bounds[:-1]}; this stage does not align with them"
        if span_in_units(s, start, stop) is None:
            missing = [l for l in range(start, stop) if np.isnan(s.mi[l]).any() and l == start] + [
                l for l in range(start + 1, stop) if np.isnan(s.ma[l]).any()
            ]
            return f"{name} statistics at batch {s.batch_size} lack layer(s) {missing or list(range(start, stop))}"
    return "unknown"


def check_same_campaign(where: str, path: str, identity: dict, other_identity: dict) -> None:
    """Refuse a recompute profile (``where``) of another model, cluster, seed or training options than the profile
    at ``path`` ([Note: recompute chosen per stage] in predict/memory.py): the two predict stages of one plan."""
    def training(ident: dict) -> dict:  # the run options that shape memory, recompute and backend aside
        options = ident.get("run_options") or {}
        return {k: v for k, v in options.items() if k not in ("activation_checkpointing", "backend")}

    identity, other_identity = {**identity, "training": training(identity)}, {**other_identity,
                                                                              "training": training(other_identity)}
    for key in ("model", "model_config", "num_layers", "cluster", "seed", "training"):
        if identity.get(key) != other_identity.get(key):
            raise ProfileError(f"{where} profiles another {key} than {path!r}"
                               f" ({other_identity.get(key)!r} vs {identity.get(key)!r})",
                               fix="profile the same model on the same cluster with --activation-checkpointing")

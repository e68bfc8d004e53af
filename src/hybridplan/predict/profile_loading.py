"""A :class:`~hybridplan.predict.memory.MemoryPredictor` read from a profile database: its statistics, targets,
training options and the tables the campaign recorded (parameter shapes, weight stash, loss and head phases,
layer classes), and the recompute profile beside it checked to be the same campaign. Kept apart from the
predictor so that memory.py holds the prediction and this module how a profile becomes one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hybridplan.errors import ProfileError
from hybridplan.predict.plan_checks import check_same_campaign
from hybridplan.predict.reserved import reserved_excess
from hybridplan.predict.zero_layout import ZeroLayout
from hybridplan.profiling.loss_memory import HEAD_BACKWARD_META, LOSS_BACKWARD_META
from hybridplan.profiling.stage_memo import LAYER_CLASSES_META

if TYPE_CHECKING:
    from hybridplan.predict.memory import MemoryPredictor
    from hybridplan.profiling.database import ProfileDB

__all__ = ["predictor_from_db", "predictor_from_profile"]


def predictor_from_db(cls: type[MemoryPredictor], path: str | Path, *, schedule: str | None,
                      global_batch_size: int | None, num_microbatches: int | None, degree_fit: str, method: str,
                      recompute_db: str | Path | None) -> MemoryPredictor:
    """:meth:`MemoryPredictor.from_db`."""
    from hybridplan.profiling.database import ProfileDB

    with ProfileDB(path) as db:
        predictor = predictor_from_profile(cls, db, schedule=schedule, global_batch_size=global_batch_size,
                                           num_microbatches=num_microbatches, degree_fit=degree_fit, method=method)
        identity = db.identity
    if recompute_db is None:
        return predictor
    with ProfileDB(recompute_db) as other:
        recomputed = predictor_from_profile(cls, other, schedule=predictor.schedule,
                                            global_batch_size=predictor.global_batch_size,
                                            num_microbatches=predictor.num_microbatches, degree_fit=degree_fit,
                                            method=method)
        other_identity = other.identity
    where = f"--recompute-db {str(recompute_db)!r}"
    if not recomputed.recompute:
        raise ProfileError(f"{where} was profiled without recompute",
                           fix="give a profile taken with 'hybridplan profile ... --activation-checkpointing'")
    if predictor.recompute:
        raise ProfileError(f"{str(path)!r} was itself profiled with recompute; {where} adds nothing",
                           fix="give the profile taken without recompute as --db")
    check_same_campaign(where, str(path), identity, other_identity)
    predictor.recomputed = recomputed
    return predictor


def predictor_from_profile(cls: type[MemoryPredictor], db: ProfileDB, *, schedule: str | None,
                           global_batch_size: int | None, num_microbatches: int | None, degree_fit: str,
                           method: str) -> MemoryPredictor:
    """:meth:`MemoryPredictor.from_profile`."""
    db.require_memory()
    meta = db.meta
    shapes = meta.get("parameter_shapes")
    predictor = cls(
        db.statistics,
        num_layers=meta["num_layers"],
        schedule=schedule or meta["schedule"],
        global_batch_size=global_batch_size or meta["global_batch_size"],
        num_microbatches=num_microbatches or meta["num_microbatches"],
        degree_fit=degree_fit,
        method=method,
        profile_schedule=meta["schedule"],
        stash=db.weight_stash,
        recompute=bool(db.run_options.get("activation_checkpointing", False)),
        device_type=db.run_options.get("device_type", "cpu"),
        zero_layout=None if shapes is None else ZeroLayout(shapes, meta.get("tensor_shard_shapes"),
                                                           precision=db.run_options.get("precision", "fp32")),
        reserved=reserved_excess(db),
        loss_backward=meta.get(LOSS_BACKWARD_META),
        head_backward=meta.get(HEAD_BACKWARD_META),
        layer_classes=meta.get(LAYER_CLASSES_META),
    )
    predictor.source = str(db.path)
    return predictor

"""Where a command's inputs come from: the profile database, the layer-time profile, the model, the targets.

Every planning verb reads the same few things, possibly from two files (a memory profile and a time profile),
with the user's options taking precedence: :class:`Sources` gathers them once, opening the database once, and
applies [Note: a file is data] (models/profiled.py) to the model either file names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridplan.errors import UsageError
from hybridplan.models.profiled import model_for_profile, recorded_fingerprint
from hybridplan.plan import Schedule, as_schedule
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.database import ProfileDB
from hybridplan.profiling.time_profile import TimeProfile

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel

__all__ = ["Targets", "Sources"]


@dataclass(frozen=True)
class Targets:
    """The batch and schedule a plan is for."""

    global_batch_size: int
    num_microbatches: int | None
    """None where neither the user nor a profile says (the throughput search varies it anyway)."""
    schedule: Schedule


@dataclass
class Sources:
    """A command's inputs (module docstring). Build with :meth:`open`; close with :meth:`close` (or ``with``).

    Attributes:
        db: the profile database, if any.
        time_profile_path: the layer-time JSON, if any (else the database's layer times are used).
        given_model: the user's ``--model``, if any.
        warn: hears notes (an incomplete layer-time table left out, a far extrapolation of the batch).
        given_time_profile: a time profile made in memory (estimated: profiling/estimated_times.py), used before
            the file and the database.
    """

    db: ProfileDB | None
    time_profile_path: str | None = None
    given_model: str | None = None
    warn: Callable[[str], None] = field(default=lambda _msg: None)
    given_time_profile: TimeProfile | None = None

    @classmethod
    def open(cls, db: str | Path | None, *, time_profile: str | None = None, model: str | None = None,
             warn: Callable[[str], None] | None = None, given_time_profile: TimeProfile | None = None) -> Sources:
        """Open the database (read only) and remember the rest."""
        return cls(ProfileDB(db) if db else None, time_profile, model, warn or (lambda _msg: None), given_time_profile)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()

    def __enter__(self) -> Sources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def meta(self) -> dict[str, Any]:
        """The database's settings ({} without one)."""
        return self.db.meta if self.db is not None else {}

    # ------------------------------------------------------------------ time
    def find_time_profile(self) -> TimeProfile | None:
        """The given time profile, else the layer-time JSON if given, else the database's layer times, else None.

        ``time_profile_path`` may name several files separated by commas (one per device type, e.g.
        ``t4.json,v100.json``): they are merged into one profile (profiling/importers.py ``merge_device_types``).
        A path that exists as it is, comma or not, is one file.
        """
        if self.given_time_profile is not None:
            return self.given_time_profile
        if self.time_profile_path:
            paths = [self.time_profile_path]
            if "," in self.time_profile_path and not Path(self.time_profile_path).exists():
                paths = [p.strip() for p in self.time_profile_path.split(",") if p.strip()]
            if len(paths) == 1:
                return TimeProfile.load(paths[0])
            from hybridplan.profiling.importers import merge_device_types

            return merge_device_types([TimeProfile.load(p) for p in paths])
        if self.db is not None and self.db.has_layer_times:
            return self.db.time_profile(warn=self.warn)
        return None

    def time_profile(self) -> TimeProfile:
        """:meth:`find_time_profile`, required.

        Raises:
            UsageError: if neither a file nor the database gives layer times.
        """
        profile = self.find_time_profile()
        if profile is None:
            held = f", and {str(self.db.path)!r} holds none" if self.db is not None else ""
            raise UsageError(f"a time prediction needs layer times{held}",
                             fix="give --time-profile FILE, or a --db measured with 'hybridplan profile --time'")
        return profile

    # ------------------------------------------------------------------ model
    def model_name(self, profile: TimeProfile | None = None) -> str | None:
        """The model the plans are for: ``--model``, else the one a profile records if it is a zoo model.

        Raises:
            ProfileError: if a profile names user code and no ``--model`` was given, or ``--model`` is another model.
        """
        meta = self.meta
        if meta.get("model") is not None:
            return model_for_profile(meta["model"], self.given_model, source=f"profile database {str(self.db.path)!r}"
                                     if self.db is not None else "the profile",
                                     fingerprint=recorded_fingerprint(meta.get("identity", {})))
        recorded = meta.get("time_identity", {}).get("model") or (profile.model if profile is not None else None)
        if meta.get("time_identity") and self.db is not None:
            source = f"profile database {str(self.db.path)!r}"
        else:
            source = f"time profile {self.time_profile_path!r}"
        return model_for_profile(recorded, self.given_model, source=source)

    def model(self, profile: TimeProfile | None = None) -> LayeredModel:
        """The model object (:meth:`model_name`, built).

        Raises:
            UsageError: if no model is known.
        """
        model = self.optional_model(profile)
        if model is None:
            raise UsageError("the model is unknown (the profile names none from the zoo)",
                             fix="give --model (zoo name or module:function)")
        return model

    def optional_model(self, profile: TimeProfile | None = None) -> LayeredModel | None:
        """The model object if one is known (an imported third-party profile names none), else None."""
        name = self.model_name(profile)
        if name is None:
            return None
        from hybridplan.models.zoo import get_model

        return get_model(name)

    # ------------------------------------------------------------------ targets and memory
    def targets(self, *, global_batch_size: int | None, num_microbatches: int | None,
                schedule: str | None) -> Targets:
        """The user's targets, else the database's, else 1F1B.

        Raises:
            UsageError: if no global batch is known.
        """
        meta = self.meta
        gbs = global_batch_size or meta.get("global_batch_size")
        if not gbs:
            raise UsageError("the global batch size is unknown",
                             fix="give --global-batch-size (or a --db whose campaign has one)")
        m = num_microbatches or meta.get("num_microbatches")
        return Targets(int(gbs), None if m is None else int(m), as_schedule(schedule or meta.get("schedule") or "1f1b"))

    def memory_predictor(self, targets: Targets, *, degree_fit: str = "log",
                         recompute_db: str | Path | None = None) -> MemoryPredictor | None:
        """The memory predictor at ``targets`` (None without memory statistics); warns of a far extrapolation.
        ``recompute_db``: a profile taken with recompute that predicts the stages a plan recomputes
        (``MemoryPredictor.from_db``, which checks that it profiles the same model and cluster)."""
        if self.db is None or not self.db.has_memory:
            return None
        m = targets.num_microbatches
        m = m if m and targets.global_batch_size % m == 0 else 1
        if recompute_db is None:
            predictor = MemoryPredictor.from_profile(self.db, schedule=targets.schedule, degree_fit=degree_fit,
                                                     global_batch_size=targets.global_batch_size, num_microbatches=m)
        else:
            predictor = MemoryPredictor.from_db(self.db.path, schedule=targets.schedule, degree_fit=degree_fit,
                                                global_batch_size=targets.global_batch_size, num_microbatches=m,
                                                recompute_db=recompute_db)
        note = predictor.scaling_note()
        if note is not None:
            self.warn(note)
        return predictor

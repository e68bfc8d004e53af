"""The auxiliary tables a profile records besides its measurements, computed on fake tensors, once per database.

A campaign measures spans of layers; what the predictor needs beyond that follows from the model's shapes and is
computed without running it: the per-layer bytes of a PipeDream-2BW weight stash in each scenario
(profiling/stash_sizes.py), the parameter shards a tensor rank holds at each profiled tensor degree
(runtime/split_layers.py), the loss's backward bytes and the head's (profiling/loss_memory.py). Each is recorded once (a
resumed campaign finds it in the database) and none may stop the memory campaign: a model fake tensors cannot build
gets a line saying which predictions the profile will then refuse, and the table is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hybridplan.models.base import LayeredModel
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.stage_memo import StageMemo, code_digest
from hybridplan.profiling.store import ProfileStore

__all__ = ["record_auxiliary_tables"]


def record_auxiliary_tables(store: ProfileStore, model: LayeredModel, scenarios: Sequence[Scenario],
                            run_options: dict[str, Any], say: Callable[[str], None], memo: StageMemo | None = None) -> None:
    """Record into ``store`` each auxiliary table of ``model`` it does not hold yet, for the campaign's
    ``scenarios`` and ``run_options`` (its precision and device type); ``say`` gets a line per table left out.
    With ``memo``, a table computed before for the same model, options and code is read from it (each is a
    function of these alone: profiling/stage_memo.py)."""
    tables = _Tables(model, memo)
    _record_weight_stash(store, model, scenarios, run_options, say, tables)
    _record_shard_shapes(store, model, scenarios, say, tables)
    _record_loss_backward(store, model, run_options, say, tables)
    _record_head_backward(store, model, scenarios, run_options, say, tables)


class _Tables:
    """Computes a table, or reads it from the memo where the model's layers have signatures (else it computes)."""

    def __init__(self, model: LayeredModel, memo: StageMemo | None) -> None:
        shareable = memo is not None and all(model.layer_signature(i) is not None for i in range(model.num_layers))
        self.memo = memo if shareable else None
        self.model = {k: v for k, v in model.config().items() if k != "name"}

    def get(self, table: str, args: dict[str, Any], compute: Callable[[], Any]) -> Any:
        if self.memo is None:
            return compute()
        return self.memo.cached({"code": code_digest(), "table": table, "model": self.model, **args}, compute)


def _record_weight_stash(store: ProfileStore, model: LayeredModel, scenarios: Sequence[Scenario],
                         options: dict[str, Any], say: Callable[[str], None], tables: _Tables) -> None:
    """Per-layer bytes of a PipeDream-2BW weight stash in each scenario (computed on fake tensors, once),
    with which the predictor turns a profile of one schedule into predictions for the other."""
    from hybridplan.profiling.stash_sizes import layer_stash_bytes

    have = store.weight_stash()
    keys = {("none", 1)} | {(s.kind, s.degree) for s in scenarios if s.kind == "tensor" and s.degree > 1}
    for kind, degree in sorted(keys):
        if (kind, degree) in have:
            continue
        try:
            precision, device = options.get("precision", "fp32"), options.get("device_type", "cpu")
            sizes = tables.get("weight_stash", {"kind": kind, "degree": degree, "precision": precision, "device": device},
                               lambda: layer_stash_bytes(model, kind, degree, precision=precision, device_type=device))
        except Exception as e:  # an auxiliary table must not stop the memory campaign (a model fake tensors cannot build)
            say(f"weight-stash sizes of {kind} x{degree} not recorded ({type(e).__name__}: {e}): predictions"
                " of 2bw plans from this profile will be refused unless it is taken with --schedule 2bw")
            continue
        store.replace_weight_stash(kind, degree, sizes)


def _record_shard_shapes(store: ProfileStore, model: LayeredModel, scenarios: Sequence[Scenario],
                         say: Callable[[str], None], tables: _Tables) -> None:
    """Per tensor degree profiled, the parameter shards of a tensor rank, layer by layer (on fake tensors, once):
    what ZeRO-1 partitions over the data group of a data x tensor stage ([Note: predicting ZeRO from a
    profile] in predict/zero_layout.py)."""
    from hybridplan.runtime.split_layers import layer_shard_shapes

    have = dict(store.get_meta("tensor_shard_shapes") or {})
    degrees = sorted({s.degree for s in scenarios if s.kind == "tensor" and s.degree > 1} - {int(d) for d in have})
    for degree in degrees:
        try:
            have[str(degree)] = tables.get("shard_shapes", {"degree": degree},
                                           lambda: layer_shard_shapes(model, degree))  # noqa: B023 (called at once)
        except Exception as e:  # an auxiliary table must not stop the memory campaign (as the weight stash's)
            say(f"parameter shards of tensor x{degree} not recorded ({type(e).__name__}: {e}): ZeRO-1 of"
                " data x tensor stages will not be predicted from this profile")
    if degrees:
        store.set_meta("tensor_shard_shapes", have)


def _record_loss_backward(store: ProfileStore, model: LayeredModel, options: dict[str, Any],
                          say: Callable[[str], None], tables: _Tables) -> None:
    """The loss's backward transient at one and two sample groups (on fake tensors, once): the floor of the
    backward transients of a stage that ends the model ([Note: the loss's backward floor] in
    profiling/loss_memory.py)."""
    from hybridplan.profiling.loss_memory import LOSS_BACKWARD_META, loss_backward_bytes

    if store.get_meta(LOSS_BACKWARD_META) is not None:
        return
    try:
        precision = options.get("precision", "fp32")
        measured = tables.get("loss_backward", {"precision": precision},
                              lambda: loss_backward_bytes(model, precision=precision))
    except Exception as e:  # an auxiliary table must not stop the memory campaign (as the weight stash's)
        say(f"the loss's backward bytes not recorded ({type(e).__name__}: {e}): the backward of stages that"
            " end the model is predicted by the batch scaling alone")
        return
    if measured is not None:
        store.set_meta(LOSS_BACKWARD_META, measured)


def _record_head_backward(store: ProfileStore, model: LayeredModel, scenarios: Sequence[Scenario],
                          options: dict[str, Any], say: Callable[[str], None], tables: _Tables) -> None:
    """Per tensor degree profiled (and unsplit), the head's backward phase at several sample groups (on fake
    tensors, once; checkpointed in a recompute profile, and taken again where an earlier one was not or lacks the
    head's input bytes): what a
    ZeRO-2/3 data x tensor stage that ends the model holds while its head runs ([Note: the head's backward phase]
    in profiling/loss_memory.py)."""
    from hybridplan.profiling.loss_memory import HEAD_BACKWARD_META, head_backward_bytes

    recompute = bool(options.get("activation_checkpointing", False))
    have = {d: v for d, v in (store.get_meta(HEAD_BACKWARD_META) or {}).items()
            if v.get("recompute", False) == recompute and "input_bytes" in v}  # taken again where older
    degrees = sorted(({1} | {s.degree for s in scenarios if s.kind == "tensor"}) - {int(d) for d in have})
    for degree in degrees:
        try:
            precision = options.get("precision", "fp32")
            measured = tables.get("head_backward", {"degree": degree, "precision": precision, "recompute": recompute},
                                  lambda: head_backward_bytes(model, degree, precision=precision,  # noqa: B023
                                                              recompute=recompute))
        except Exception as e:  # an auxiliary table must not stop the memory campaign (as the weight stash's)
            say(f"the head's backward bytes at tensor x{degree} not recorded ({type(e).__name__}: {e}): ZeRO-2/3"
                " data x tensor stages that end the model take the loss's phase for the head's")
            continue
        if measured is not None:
            have[str(degree)] = measured
    if degrees:
        store.set_meta(HEAD_BACKWARD_META, have)

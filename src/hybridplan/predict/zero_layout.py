"""What ZeRO shards of a data-parallel stage, computed from the parameters' shapes (no run).

This module holds the layout (each rank's share of the parameters, their chunks, their gathered bytes);
predict/zero3_transients.py and predict/zero2_replay.py hold the rules that compose ZeRO-3's and ZeRO-2's
transients from it, each with its Notes; predict/zero_stage.py applies them to a profile.

[Note: predicting ZeRO from a profile] A ZeRO stage (``"zero": 1|2|3``, runtime/sharding.py) holds, per
device, exactly what an unsharded data-parallel stage holds except for what ZeRO shards, and what it shards
is a function of the parameters' shapes alone, which the profile records (models/base.py
``parameter_shapes``, on the meta device). Measured on the simulated devices (gpt-tiny, layers 0-4 as 2
replicas, P = 836,608 parameter bytes over n = 66 tensors, AdamW in fp32):

- **ZeRO-1** (``ZeroRedundancyOptimizer``): every forward, backward and gradient byte is the data stage's;
  only the optimizer state differs: a device keeps the AdamW moments (2 x its parameters' bytes) and step
  counters (a 0-dim fp32 tensor each: torch/optim/adamw.py, not capturable) of its share of the parameters,
  not of all (static 2,510,088 = 3P + 4n unsharded -> 1,673,340 and 1,673,356). The share is
  ``ZeroRedundancyOptimizer._partition_parameters``'s (torch/distributed/optim/zero_redundancy_optimizer.py):
  whole parameters, sorted by size (largest first, stable), each to the rank holding the fewest elements
  so far (the first such). :func:`zero1_shares` recomputes it, so the ZeRO-1 stage is the data stage's
  prediction with ``static`` moved by :meth:`ZeroLayout.static_delta`: no profiling run is added. Its step
  transient follows the rank's share too: AdamW's single-tensor step (the CPU runtime's, ``foreach=False``)
  holds two temporaries of one parameter's size at once (torch/optim/adam.py ``_single_tensor_adam``:
  ``exp_avg_sq.sqrt() / bias_correction2_sqrt``), so the transient moves by twice the difference between the
  largest parameter of the share and of the stage (:meth:`ZeroLayout.step_delta`; measured: the MLP's 8,192
  bytes unsharded, 8,192 and 2,560 on its two ranks; gpt-tiny's ranks measure 196,608 against 132,096
  unsharded, 64 KiB above this rule: the step sets a gpt-tiny stage's peak only when the gradients outweigh the
  activations in flight).
- **ZeRO-3** (FSDP2 ``fully_shard`` per layer): what FSDP allocates inside a forward and a backward (a layer's
  all-gathered parameters, the unsharded gradients before their reduce-scatter, the next layer prefetched in a
  backward) is a transient whose size depends on the layers' order and on the moment it overlaps the layer's
  own temporaries, which the profile's span statistics cannot place (they keep the maximum over the span).
  So ZeRO-3 is profiled: a ``data<d>-zero3`` scenario per data degree packs the same spans as ``data<d>``
  (``hybridplan profile --zero``; at most twice the runs of a profile without it). Its devices differ only in
  the optimizer state of their dim-0 chunks (FSDP2 ``_init_sharded_param``: ``torch.chunk`` rows, the last
  ranks' chunks smaller or empty; the stored shards and the reduce-scattered gradients are padded to the
  first rank's), which :meth:`ZeroLayout.static_delta` adds to the profiled first rank's statistics.
  Its forward transient is not the scenario's, though: [Note: the sharded forward from the data stage].
  Its later backwards under GPipe are not the scenario's either: [Note: a backward after a backward]; and its
  backwards are at least [Note: the sharded backward's floor]. At the model's last layer both rules change:
  [Note: the loss runs outside every FSDP unit] (these four in predict/zero3_transients.py).
  In mixed precision the same rules hold with what FSDP2's ``MixedPrecisionPolicy`` moves: the layers are
  gathered as low-precision copies (:meth:`ZeroLayout.gathered_bytes` counts 2 bytes per element), the unsharded
  stage they are composed from holds low-precision parameters and gradients (:meth:`ZeroLayout.layer_bytes`),
  and the gradients are kept as fp32 shards (:meth:`ZeroLayout.shard_bytes`) cast from each reduce-scatter's
  output ([Note: the reduce-scatter in mixed precision] in predict/zero3_transients.py).
- [Note: ZeRO-1 of a data x tensor stage] Each of the ``d`` replicas of a ``data+tensor`` stage is a ``t``-way
  tensor stage at ``1/d`` of the batch ([Note: a data x tensor stage is a tensor stage at a smaller batch] in
  predict/plan_prediction.py), and ZeRO-1 there (runtime/sharding.py ``ZeroOneOptimizer``) hands each tensor rank's
  *shards* to a ``ZeroRedundancyOptimizer`` over that rank's data group. So the stage is the tensor stage's
  prediction at the replica's batch with ``static`` and the step transient moved exactly as for a data stage,
  by the ZeRO-1 partition of the shards' sizes over ``d`` ranks. The shards' shapes are the split layers'
  (every tensor rank's are equal: a split needs the degree to divide the dimension), which a profile records
  per tensor degree it profiles (profiling/auxiliary_tables.py, built on fake tensors as the runtime splits them:
  a Megatron row-parallel layer keeps its bias whole, so the shapes are read off the split, not divided).
  ZeRO-2 and ZeRO-3 there: [Note: ZeRO-3 composed from an unsharded stage] in predict/zero3_transients.py.
- **ZeRO-2** (``reshard_after_forward=False``): see [Note: predicting ZeRO-2 from the ZeRO-3 scenario] in
  predict/zero2_replay.py; in mixed precision with the low-precision gathered bytes, as ZeRO-3.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from hybridplan.runtime.zero_shares import fsdp_rows

__all__ = ["ZeroLayout", "zero1_shares", "fsdp_rows", "STEP_COUNTER_BYTES"]

STEP_COUNTER_BYTES = 4
"""AdamW's per-parameter ``step``: ``torch.tensor(0.0, dtype=_get_scalar_dtype())`` (float32 unless the default
dtype is float64; torch/optim/adam.py ``_init_group``, not capturable/fused as the runtime builds it); counted as
4 bytes per parameter tensor by the exact tracker (measured: static = 3P + 4n)."""

_STEP_TEMPORARIES = 2
"""AdamW's single-tensor step (the CPU runtime's, ``foreach=False``) holds two temporaries of one parameter's size at
once (torch/optim/adam.py ``_single_tensor_adam``: ``exp_avg_sq.sqrt() / bias_correction2_sqrt``)."""

_MOMENTS = 2
"""AdamW keeps ``exp_avg`` and ``exp_avg_sq``, each the parameter's size and dtype (torch/optim/adam.py)."""


def zero1_shares(numels: Sequence[int], world: int) -> list[list[int]]:
    """Indices of the parameters each rank's ``ZeroRedundancyOptimizer`` steps (its partition, recomputed).

    Sorted by size, largest first (a stable sort: ties keep the parameters' order), each parameter goes to the
    rank with the fewest elements so far, the lowest rank on ties
    (``ZeroRedundancyOptimizer._partition_parameters`` and ``_get_min_index``).

    >>> zero1_shares([4, 10, 4, 3], 2)
    [[1], [0, 2, 3]]
    """
    shares: list[list[int]] = [[] for _ in range(world)]
    sizes = [0] * world
    for i in sorted(range(len(numels)), key=lambda i: -numels[i]):
        rank = sizes.index(min(sizes))
        shares[rank].append(i)
        sizes[rank] += numels[i]
    return [sorted(s) for s in shares]


class ZeroLayout:
    """The trained parameters of every layer, as a profile records them: ``[bytes per element, *shape]``.

    Args:
        shapes: per layer, per parameter (``parameters()`` order), ``[element bytes, *shape]``.
        tensor_shards: per tensor degree (a JSON key: its decimal string), the same for the parameter shards a
            tensor rank holds (runtime/split_layers.py ``layer_shard_shapes``; ``None`` for a layer that does not
            split at that degree); empty for a profile that did not record them.
        precision: the profiled runs' precision. In mixed precision ZeRO-1 shards the fp32 master copies with
            the moments (runtime/sharding.py) and its step holds an fp32 copy of one gradient besides AdamW's two
            temporaries; ZeRO-2/3 keep fp32 shards as the masters in either precision (``shard_stage``).
    """

    def __init__(self, shapes: Sequence[Sequence[Sequence[int]]],
                 tensor_shards: Mapping[str, Sequence[Sequence[Sequence[int]] | None]] | None = None, *,
                 precision: str = "fp32") -> None:
        self.shapes = [[(int(p[0]), tuple(int(x) for x in p[1:])) for p in layer] for layer in shapes]
        self.tensor_shards = dict(tensor_shards or {})
        self.precision = precision
        # (a search asks every span at every degree, once per later-stage count: kept, not recomputed)
        self._of_degree: dict[int, ZeroLayout | None] = {}
        self._shifts: dict[tuple[int, int, int, int], list[tuple[int, int]]] = {}
        self._zero1: dict[tuple[int, int, int], list[list[int]]] = {}
        self._layer_values: dict[tuple[object, ...], tuple[list[int], list[int]]] = {}
        self._span_params: dict[tuple[int, int], tuple[list[tuple[int, tuple[int, ...]]], list[int]]] = {}
        self._rank_shifts: dict[tuple[object, ...], tuple[int, int, int]] = {}

    def _per_layer(self, key: tuple[object, ...], value: object) -> tuple[list[int], list[int]]:
        """A per-layer quantity ``value(layer)`` for every layer, and its prefix sums, computed once per ``key``: the
        search asks every span (``L^2/2``) of each degree and rank, and a span's sum or maximum over its layers is
        then a slice rather than a walk over its parameters."""
        if key not in self._layer_values:
            values = [value(layer) for layer in self.shapes]  # type: ignore[operator]
            prefix = [0]
            for v in values:
                prefix.append(prefix[-1] + v)
            self._layer_values[key] = (values, prefix)
        return self._layer_values[key]

    def _span_sum(self, key: tuple[object, ...], value: object, start: int, stop: int) -> int:
        prefix = self._per_layer(key, value)[1]
        return prefix[stop] - prefix[start]

    def _span_max(self, key: tuple[object, ...], value: object, start: int, stop: int) -> int:
        return max(self._per_layer(key, value)[0][start:stop], default=0)

    def _chunk_max(self, degree: int, rank: int, start: int, stop: int) -> int:
        """The largest parameter chunk (bytes) ``rank`` of ``degree`` FSDP2 ranks holds in ``[start, stop)``."""
        return self._span_max(("chunk", degree, rank), lambda layer: max(
            (e * fsdp_rows((shape or (1,))[0], degree, rank) * math.prod(shape[1:]) for e, shape in layer), default=0),
            start, stop)

    def of_tensor_shards(self, tensor_degree: int) -> ZeroLayout | None:
        """The layout of one tensor rank's shards at ``tensor_degree`` ([Note: ZeRO-1 of a data x tensor stage]),
        or None where the profile did not record that degree. A layer that does not split holds nothing here
        (no tensor stage can hold it)."""
        if tensor_degree not in self._of_degree:
            shards = self.tensor_shards.get(str(tensor_degree))
            self._of_degree[tensor_degree] = (None if shards is None else
                                              ZeroLayout([layer or [] for layer in shards], precision=self.precision))
        return self._of_degree[tensor_degree]

    def _params(self, start: int, stop: int) -> list[tuple[int, tuple[int, ...]]]:
        if (start, stop) not in self._span_params:  # asked once per rank of every degree: built once
            params = [p for layer in self.shapes[start:stop] for p in layer]
            self._span_params[(start, stop)] = (params, [e * math.prod(shape) for e, shape in params])
        return self._span_params[(start, stop)][0]

    def _param_bytes(self, start: int, stop: int) -> list[int]:
        """Each parameter's bytes in :meth:`_params` order."""
        self._params(start, stop)
        return self._span_params[(start, stop)][1]

    @property
    def mixed(self) -> bool:
        """Whether the profile was taken in mixed precision (bf16 or fp16: 2-byte copies of the recorded fp32
        elements; runtime/precision.py)."""
        return self.precision != "fp32"

    def _low(self, sizes: list[int]) -> list[int]:
        """``sizes`` (recorded fp32 bytes) as the low-precision copies hold them in mixed precision."""
        return [b // 2 for b in sizes] if self.mixed else sizes

    @property
    def _unsharded_step_temporaries(self) -> int:
        """Temporaries of one parameter's size an unsharded step holds: AdamW's two, and in mixed precision the
        fp32 copy of the gradient ``MixedPrecisionAdamW`` steps with (runtime/precision.py)."""
        return _STEP_TEMPORARIES + 1 if self.mixed else _STEP_TEMPORARIES

    @property
    def scatter_copies(self) -> int:
        """Copies of a layer's gradient shard (in gathered-bytes units over the degree) a reduce-scatter holds: its
        output, and in mixed precision the output's fp32 copy too (twice its bytes; [Note: the reduce-scatter in
        mixed precision] in predict/zero3_transients.py)."""
        return 3 if self.mixed else 1

    def _state(self, element: int, numel: int, zero: int) -> int:
        """AdamW state of one parameter (or share of one): its moments and step count, and in mixed precision
        under ZeRO-0/1 its fp32 master copy (runtime/precision.py; the recorded element size is the fp32
        model's). Under ZeRO-2/3 the masters are the FSDP shards, parameters equal on every rank."""
        master = 1 if self.mixed and zero <= 1 else 0
        return (_MOMENTS + master) * element * numel + STEP_COUNTER_BYTES

    def optimizer_bytes(self, start: int, stop: int, zero: int, degree: int, rank: int) -> int:
        """AdamW state bytes that ``rank`` of a ``degree``-way stage ``[start, stop)`` holds at ZeRO ``zero``."""
        if zero == 0:
            return self._span_sum(("state",), lambda layer: sum(
                self._state(e, math.prod(shape), 0) for e, shape in layer), start, stop)
        if zero == 1:
            params = self._params(start, stop)
            share = self._zero1_shares(start, stop, degree)[rank]
            return sum(self._state(params[i][0], math.prod(params[i][1]), zero) for i in share)
        return self._span_sum(("fsdp state", degree, rank), lambda layer: sum(
            self._state(e, fsdp_rows((shape or (1,))[0], degree, rank) * math.prod((shape or (1,))[1:]), 2)
            for e, shape in layer), start, stop)

    def _zero1_shares(self, start: int, stop: int, degree: int) -> list[list[int]]:
        """:func:`zero1_shares` of the span's parameters over ``degree`` ranks, partitioned once (a sort of the
        stage's parameters, which every rank's state and step ask for)."""
        key = (start, stop, degree)
        if key not in self._zero1:
            self._zero1[key] = zero1_shares([math.prod(shape) for _, shape in self._params(start, stop)], degree)
        return self._zero1[key]

    def static_delta(self, start: int, stop: int, zero: int, degree: int, rank: int) -> int:
        """Static bytes of ``rank`` minus those of the profiled device it is predicted from: for ZeRO-1 the
        unsharded data stage (every rank's optimizer state), for ZeRO-2/3 the first rank of the same sharding."""
        base = self.optimizer_bytes(start, stop, 0 if zero == 1 else zero, degree, 0)
        return self.optimizer_bytes(start, stop, zero, degree, rank) - base

    def shift(self, start: int, stop: int, zero: int, degree: int, rank: int) -> tuple[int, int]:
        """How ``rank``'s ``static`` and step transient differ from the profiled device's: (:meth:`static_delta`,
        :meth:`step_delta`)."""
        return self.static_delta(start, stop, zero, degree, rank), self.step_delta(start, stop, zero, degree, rank)

    def shifts(self, start: int, stop: int, zero: int, degree: int) -> list[tuple[int, int]]:
        """:meth:`shift` of every rank ``0 .. degree - 1``, computed once per span (a search asks each span once per
        later-stage count; ZeRO-1's partition is made once for all ranks: :meth:`_zero1_shares`)."""
        key = (start, stop, zero, degree)
        if key not in self._shifts:
            self._shifts[key] = [self.shift(start, stop, zero, degree, r) for r in range(degree)]
        return self._shifts[key]

    def gathered_bytes(self, start: int, stop: int, degree: int) -> list[int]:
        """Per layer of ``[start, stop)``: the bytes FSDP2 holds while the layer's parameters are all-gathered over
        ``degree`` ranks: :meth:`padded_bytes`, in mixed precision as the policy's low-precision copies (2 bytes per
        element; ``MixedPrecisionPolicy(param_dtype=...)`` casts each shard before the all-gather)."""
        return self._low(self.padded_bytes(start, stop, degree))

    def padded_bytes(self, start: int, stop: int, degree: int) -> list[int]:
        """Per layer of ``[start, stop)``: its parameters at their recorded (fp32) size as ``degree`` padded chunks of
        ``ceil(dim0 / degree)`` rows each (FSDP2 ``FSDPParam.init_all_gather_outputs`` allocates ``world_size`` x
        the padded shard; the unsharded parameter is a view of it). 0 for a layer without parameters (not an FSDP
        unit: runtime/sharding.py)."""
        return self._padded(degree)[0][start:stop]

    def _padded(self, degree: int) -> tuple[list[int], list[int]]:
        """:meth:`padded_bytes` of every layer, and their prefix sums."""
        return self._per_layer(("padded", degree), lambda layer: sum(
            element * degree * fsdp_rows((shape or (1,))[0], degree, 0) * math.prod((shape or (1,))[1:])
            for element, shape in layer))

    def layer_bytes(self, start: int, stop: int) -> list[int]:
        """Per layer of ``[start, stop)``: its parameters' bytes in the unsharded stage (its whole gradients' too):
        in mixed precision the low-precision copies (runtime/precision.py)."""
        return self._low(self._per_layer(("bytes",), lambda layer: sum(e * math.prod(shape) for e, shape in layer))[0][start:stop])

    def shard_bytes(self, start: int, stop: int, degree: int) -> list[int]:
        """Per layer of ``[start, stop)``: the reduce-scattered gradient shard each of ``degree`` FSDP2 ranks keeps
        (every rank's padded to the first rank's chunk; fp32 in either precision: the gradients accumulate as
        fp32 shards, runtime/sharding.py)."""
        return [b // degree for b in self.padded_bytes(start, stop, degree)]

    def scatter_extra(self, start: int, stop: int, degree: int) -> list[int]:
        """Per layer of ``[start, stop)``: what FSDP2's reduce-scatter of the layer's gradients holds in mixed
        precision beyond its input and the layer's unsharded gradients ([Note: the reduce-scatter in mixed
        precision] in predict/zero3_transients.py): the low-precision output and its fp32 copy, less the unsharded
        gradients it frees first; 0 in fp32, whose rules were measured with them."""
        if not self.mixed:
            return [0] * (stop - start)
        return [max(0, self.scatter_copies * g // degree - whole)
                for g, whole in zip(self.gathered_bytes(start, stop, degree), self.layer_bytes(start, stop))]

    def stored_bytes(self, start: int, stop: int, degree: int) -> int:
        """Parameter bytes each rank of a ``degree``-way FSDP2 stage ``[start, stop)`` stores (every rank's shard is
        padded to the first rank's chunk; its reduce-scattered gradients too; fp32 in either precision, the shards
        being the masters): :meth:`padded_bytes` over ``degree``."""
        prefix = self._padded(degree)[1]
        return (prefix[stop] - prefix[start]) // degree

    def _kept_shift(self, key: tuple[object, ...], make: Callable[[], tuple[int, int, int]]) -> tuple[int, int, int]:
        """A rank's shift, made once per ``key``: a search asks it for every rank of a span at each micro-batch size
        (the shifts do not depend on the batch), and at every plan that has the stage."""
        if key not in self._rank_shifts:
            self._rank_shifts[key] = make()
        return self._rank_shifts[key]

    def unsharded_shift(self, start: int, stop: int, degree: int, rank: int) -> tuple[int, int, int]:
        """How ``rank`` of a ZeRO-3 stage over ``degree`` ranks differs from the same stage unsharded, in ``static``,
        ``gradient`` and the step transient ([Note: ZeRO-3 composed from an unsharded stage]): it stores padded
        chunks of the parameters and of their reduce-scattered gradients, the AdamW state of its own chunks, and
        steps its largest chunk, where the unsharded stage holds and steps whole parameters (in mixed precision
        low-precision parameters and gradients beside fp32 masters and moments, and a step with an fp32 copy of
        the gradient besides AdamW's two temporaries: runtime/precision.py)."""
        return self._kept_shift(("unsharded", start, stop, degree, rank),
                                lambda: self._unsharded_shift(start, stop, degree, rank))

    def _unsharded_shift(self, start: int, stop: int, degree: int, rank: int) -> tuple[int, int, int]:
        """:meth:`unsharded_shift`, computed."""
        whole = sum(self.layer_bytes(start, stop))
        stored = self.stored_bytes(start, stop, degree)
        static = stored - whole + self.optimizer_bytes(start, stop, 3, degree, rank) - self.optimizer_bytes(
            start, stop, 0, 1, 0)
        largest = self._span_max(("largest",), lambda layer: max((e * math.prod(shape) for e, shape in layer), default=0),
                                 start, stop)
        return (static, stored - whole,
                _STEP_TEMPORARIES * self._chunk_max(degree, rank, start, stop) - self._unsharded_step_temporaries * largest)

    def wider_zero3_shift(self, start: int, stop: int, profiled: int, degree: int, rank: int) -> tuple[int, int, int]:
        """How ``rank`` of a ZeRO-3 stage over ``degree`` ranks differs from the first rank of the same stage over
        ``profiled`` ranks, in ``static``, the step transient and ``gradient`` ([Note: a ZeRO-3 stage wider than
        the profiled ones] in predict/zero_stage.py): its stored parameter chunks and their reduce-scattered
        gradients (:meth:`stored_bytes`), the AdamW state of its own chunks, and the two step temporaries of its
        largest chunk, each at ``degree`` ranks instead of ``profiled``."""
        return self._kept_shift(("wider", start, stop, profiled, degree, rank),
                                lambda: self._wider_zero3_shift(start, stop, profiled, degree, rank))

    def _wider_zero3_shift(self, start: int, stop: int, profiled: int, degree: int, rank: int) -> tuple[int, int, int]:
        """:meth:`wider_zero3_shift`, computed."""
        stored = self.stored_bytes(start, stop, degree) - self.stored_bytes(start, stop, profiled)
        static = stored + self.optimizer_bytes(start, stop, 3, degree, rank) - self.optimizer_bytes(
            start, stop, 3, profiled, 0)

        step = _STEP_TEMPORARIES * (self._chunk_max(degree, rank, start, stop) - self._chunk_max(profiled, 0, start, stop))
        return static, step, stored

    def step_delta(self, start: int, stop: int, zero: int, degree: int, rank: int) -> int:
        """ZeRO-1: how much ``rank``'s step transient differs from the unsharded stage's (twice its share's largest
        parameter less twice the stage's; 0 for the other levels, whose step is profiled)."""
        if zero != 1:
            return 0
        sizes = self._param_bytes(start, stop)
        share = self._zero1_shares(start, stop, degree)[rank]
        return self._unsharded_step_temporaries * (max((sizes[i] for i in share), default=0) - max(sizes, default=0))

"""The ZeRO-3 rules of predict/zero3_transients.py, by hand and on values measured op by op: the forward from the data
stage, the backward's floors, the prefetched layer and the last layer's phases."""

from __future__ import annotations

import math

import numpy as np

from hybridplan.predict.zero3_transients import (first_backward_prefetch_floor, loss_phases, prefetched_bytes,
                                                 sharded_backward_floor, sharded_forward_transient)


def test_sharded_forward_transient_by_hand():
    # the data stage's prefixes: forward transients 10, 30, 25, activations 5, 12, 20; gathered 4, 8, 2 bytes.
    # Layer 0: 10 + 2 * 4; layer 1 raises the transient: 30 + 2 * 8; layer 2 does not: at least the activations
    # before it, 12 + 2 * 2. ZeRO-3: the largest, 46. ZeRO-2 keeps the earlier layers: 18, 46 + 4, 16 + 12 -> 50
    assert sharded_forward_transient([10, 30, 25], [5, 12, 20], [4, 8, 2], keep=False) == 46
    assert sharded_forward_transient([10, 30, 25], [5, 12, 20], [4, 8, 2], keep=True) == 50
    # layer 2 would set it with a large all-gather: 12 + 2 * 40 (+ 12 kept)
    assert sharded_forward_transient([10, 30, 25], [5, 12, 20], [4, 8, 40], keep=True) == 104


def test_prefetched_layer_by_hand():
    # suffixes' backward transients 50, 70, 40: layer 1 sets it; the layer before it with parameters is prefetched
    assert prefetched_bytes([50, 70, 40], [10, 20, 5]) == 10
    assert prefetched_bytes([50, 70, 40], [10, 0, 5]) == 10  # layer 1 has no parameters: layer 0 still
    assert prefetched_bytes([50, 70, 40], [0, 20, 5]) == 0  # nothing before it to prefetch
    assert prefetched_bytes([50, 30, 40], [10, 20, 5]) == 0  # layer 0 raises it to 50: nothing before layer 0
    assert prefetched_bytes([60, 60, 60], [10, 20, 5]) == 20  # the last layer sets it, the others add nothing


def test_first_backward_prefetch_floor_of_wresnet_tiny_as_measured():
    """[Note: a first backward after several forwards]: wresnet-tiny's layers 4-5 as data 2 x tensor 2, ZeRO-3,
    global batch 64 in 4 micro-batches (simulated devices): the first backward measured 903,296 bytes above its
    level under GPipe and 1F1B alike, while layer 4 ran with layer 5 gathered again (traced op by op). From the
    tensor x2 stage's first-backward suffixes at the replica's batch (380,544 from layer 4, 322,176 from layer 5),
    the shards' gathered bytes (75,392 and 298,240) and their halves: 380,544 - 298,240 + 149,120 + 75,392 +
    2 x 298,240 = 903,296."""
    assert first_backward_prefetch_floor([380544, 322176], [75392, 298240], [75392, 298240], [37696, 149120]) == 903296
    # one layer with parameters: nothing to prefetch again
    assert first_backward_prefetch_floor([380544, 322176], [0, 298240], [0, 298240], [0, 149120]) == -math.inf


def test_first_backward_prefetch_floor_of_a_span_less_the_head():
    """[Note: the layers before the head]: the MLP's layers 2-5 (Linear 32x32, ReLU, head) as data 2 x tensor 2,
    ZeRO-3, under GPipe (simulated devices, traced op by op): layer 2's first backward after two forwards holds
    6,396 bytes above its level (4 of them the loss's scalar, not composed): its suffix less the head, 2,696 (the
    tensor stage's at the replica's rows without the head's activations and the 1,024-byte gradient the head hands
    back, with the head's 396-byte gradient shard), its 2,112 gathered bytes, the head gathered again (792, given as
    ``again``: once) and the head's reduce-scatter input (792, in ``extra``)."""
    assert first_backward_prefetch_floor([2696, 2120], [2112, 0], [2112, 0], [1056, 0], [792, 792], again=792) == 6392
    # without ``again`` one layer with parameters has nothing to gather again
    assert first_backward_prefetch_floor([2696, 2120], [2112, 0], [2112, 0], [1056, 0], [792, 792]) == -math.inf


def test_first_backward_prefetch_floor_holds_the_next_layers_reduce_scatter_input():
    """Three layers with parameters: the first one's moment holds the last one gathered again and the second's
    reduce-scatter input (in wresnet-tiny's two-layer span both are layer 5's): 100 - 30 + 15 + 40 + 5 + 20."""
    assert first_backward_prefetch_floor([100, 80, 60], [40, 20, 5], [40, 20, 10], [20, 10, 5]) == 150


def test_sharded_backward_floor_by_hand():
    # the data stage's suffixes 50, 70, 40; gathered 10, 20, 5: layer 2 sets 40 (+ its 5 + layer 1's 20 prefetched),
    # layer 1 raises it to 70 (+ 20 + layer 0's 10), layer 0 raises nothing
    assert sharded_backward_floor([50, 70, 40], [10, 20, 5]) == 100
    assert sharded_backward_floor([90, 70, 40], [10, 20, 5]) == 100  # layer 0: 90 + 10, nothing before it


def test_sharded_backward_floor_at_the_loss_by_hand():
    """[Note: the loss runs outside every FSDP unit]: the data stage's suffixes 35, 40 (layer 1 the model's last),
    gathered 10, 5; its head's phase 15 and its loss's 40. Layer 1: the loss holds nothing gathered (40), the head
    its 5 and the prefetched layer 0's 10 (30): 40, where the old floor added both to the loss's 40 (55). Layer 0's
    35 is above the head's 15, so its phase counts: 35 + 10 = 45. Without the head's phase known, layer 0 must
    rise above the last layer's 40 as before: it does not."""
    assert sharded_backward_floor([35, 40], [10, 5]) == 55
    assert sharded_backward_floor([35, 40], [10, 5], loss=(15, 40)) == 45
    assert sharded_backward_floor([35, 40], [10, 5], loss=(-np.inf, 40)) == 40
    # the head's phase above the loss's: 40 + 5 + 10 = 55; layer 0's 35 is below the head's 40
    assert sharded_backward_floor([35, 40], [10, 5], loss=(40, 20)) == 55


def test_loss_phases_of_gpt_tiny_head_as_traced():
    """[Note: the loss runs outside every FSDP unit]: gpt-tiny's last layer (final norm + head, 33,280 gathered bytes
    over 2 ranks) measured alone in the data2 and data2-zero3 scenarios at micro-batches of 4 and 8 (2 and 4 rows
    per replica; benchmarks/extended_accuracy's profile), and the phases at 16 (8 rows per replica) read off the
    simulated runtime's op-by-op trace of that stage: forward, the head's matmul holds the received input 32,768,
    the norm's output 33,792 and the logits 65,536 (= 132,096), the loss holds the logits and their log-softmax
    with a few scalars (197,644); backward, the head's two matmul outputs (2 x 32,768) and the loss's two
    logits-sized gradients (2 x 65,536)."""
    forward = loss_phases([4, 8], [49_420, 98_828], [99_584, 132_608], 2 * 33_280, 16)
    assert forward == (32_768 + 33_792 + 65_536, 197_644)
    backward = loss_phases([4, 8], [40_960, 65_536], [74_240, 82_432], 33_280, 16)
    assert backward == (2 * 32_768, 2 * 65_536)
    # the loss never set the data stage's value (ZeRO-3 a whole 2G above it at both sizes): no loss phase
    assert loss_phases([4, 8], [10, 20], [30, 40], 20, 16) == (40.0, -np.inf)


def test_the_heads_reduce_scatter_input_is_held_down_to_the_next_layer_with_parameters():
    """FSDP2 frees a unit's reduce-scatter input at the next unit's post-backward: the MLP's layers 0-5 hold the
    head's (792 bytes) while the ReLU (3) and layer 2 run, not layer 1 or 0; without a layer with parameters
    before the head, to the span's start."""
    from hybridplan.predict.composed_zero import _head_input_held

    mlp = [1088, 0, 2112, 0, 792]  # the MLP's gathered bytes as data 2 x tensor 2 (fp32: no reduce-scatter term)
    assert _head_input_held(mlp, [0] * 5)[0] == [0, 0, 792, 792]
    assert _head_input_held(mlp[2:], [0] * 3)[0] == [792, 792]
    assert _head_input_held(mlp[3:], [5, 7]) == ([792], [797])  # with the layer's own term
    assert _head_input_held([0, 0, 0, 792], [0] * 4)[0] == [792, 792, 792]


def test_a_recomputed_span_ending_the_model_takes_its_blocks_moments_from_the_span_less_the_head():
    """[Note: the layers before the head], recomputed: every suffix of a span ending the model is the loss's phase
    where the loss is the largest thing it runs (1,000 bytes here), which no block's backward holds, so the blocks'
    moments come from the span less the head (predict/composed_zero.py ``_moments_before_head``). By hand, fp32,
    data x2: two blocks of 16 gathered bytes (8 a shard) and a head of 32; the span less the head holds 200 bytes
    of activations of the whole span's 300; its suffixes' first backwards 150 and 120, later ones 100 and 90, so
    above the whole span's level (less the head's 100 bytes of activations, with its 16-byte gradient shard in a
    first backward) 66 and 36, 0 and -10. Block 0 sets the first (66 > 36): its own 66 - 16, then 50 + 8 + 16 + 16
    first and 50 + 16 + 16 later; block 1 36 + 16 with the head's 32-byte reduce-scatter input and block 0's 16
    prefetched. All below the loss's 1,000: both backwards are the loss's. Composed from the whole span's suffixes
    each block's moment was the loss's phase with gathered bytes (1,064 later)."""
    from hybridplan.predict.composed_zero import _moments_before_head, _recomputed_ending, recomputed_moments
    from hybridplan.predict.zero_layout import ZeroLayout
    from hybridplan.profiling.quantities import INDEX
    from hybridplan.profiling.statistics import STATISTIC_QUANTITIES

    layout = ZeroLayout([[[4, 2, 2]], [[4, 2, 2]], [[4, 4, 2]]])
    table = np.full((3, 4, len(STATISTIC_QUANTITIES)), np.nan)
    first, later, act = INDEX["first_backward_transient"], INDEX["backward_transient"], INDEX["activation"]
    table[:, 3, first] = table[:, 3, later] = 1000.0  # every suffix ending the model: the loss's phase
    table[0, 3, act], table[0, 2, act] = 300.0, 200.0
    table[0:2, 2, first], table[0:2, 2, later] = [150.0, 120.0], [100.0, 90.0]
    before = _moments_before_head(table, 0, 3, layout, 2, received=0.0)
    assert before is not None
    assert (before.first, before.later, before.prefetched) == ([90.0, 84.0], [82.0, 84.0], [0, 16])
    ending = {"first_backward_transient": 1000.0, "backward_transient": 1000.0}
    moments = recomputed_moments(table, 0, 3, layout, 2)
    assert _recomputed_ending(table, moments, before, 3, layout.gathered_bytes(0, 3, 2), -1000.0, ending,
                              prefetch_later=True) == (1000.0, 1000.0)
    assert max(v + p for v, p in zip(moments.later[:-1], moments.prefetched[:-1])) == 1064.0  # the composition before


def test_a_recomputed_zero3_first_backward_is_floored_with_the_later_layers_shards_not_their_whole_gradients():
    """[Note: a recomputed ZeRO-3 stage]: the unsharded stage's first backward suffix of layers ``k..`` holds the
    later layers' whole gradients, a ZeRO-3 rank only their shards, so the floor on that suffix is taken less the
    difference (predict/composed_zero.py ``scattered_gradients``). By hand, fp32, data x2: layers of 16, 16 and 32
    gathered bytes (shards 8, 8, 16); first suffixes 200, 150, 100, later ones 60. Layer 0 sets the first (200 > 150):
    its own 200 - 48 with the later shards 24, its 16 gathered bytes and layer 1's 16: 208, the largest moment. The
    floor on the suffixes as they are was 200 + 16 = 216; less the later layers' 24 and 16 bytes, 192 and 166, below
    the moments. The later backward: layer 0's 152 + 16 + 16 = 184."""
    from hybridplan.predict.composed_zero import recomputed_floors, recomputed_moments, scattered_gradients
    from hybridplan.predict.zero_layout import ZeroLayout
    from hybridplan.profiling.quantities import INDEX
    from hybridplan.profiling.statistics import STATISTIC_QUANTITIES

    layout = ZeroLayout([[[4, 2, 2]], [[4, 2, 2]], [[4, 4, 2]]])
    table = np.full((3, 4, len(STATISTIC_QUANTITIES)), np.nan)
    table[0:3, 3, INDEX["first_backward_transient"]] = [200.0, 150.0, 100.0]
    table[0:3, 3, INDEX["backward_transient"]] = 60.0
    moments = recomputed_moments(table, 0, 3, layout, 2)
    gathered = layout.gathered_bytes(0, 3, 2)
    assert max(v + p for v, p in zip(moments.first, moments.prefetched)) == 208.0
    assert recomputed_floors(table, moments, 0, 3, gathered, prefetch_later=True,
                             scattered=scattered_gradients(layout, 0, 3, 2)) == (208.0, 184.0)
    assert recomputed_floors(table, moments, 0, 3, gathered, prefetch_later=True, scattered=[0.0] * 3)[0] == 216.0


def test_the_first_backward_floor_before_the_head_holds_the_later_layers_shards():
    """[Note: the layers before the head]: in a first backward a ZeRO-3 rank holds the later layers' shards, where
    the unsharded suffix less the head holds their whole gradients; the floor on it is taken less the difference
    (``scattered_gradients``). By hand, fp32, data x2, two layers of 16 gathered bytes and a head of 32 (shard 16):
    first suffixes of the span less the head 400 and 150, less the head's 100 bytes of activations, with its shard:
    316 and 66. Layer 0 sets the floor: 316 less layer 1's 8 bytes beyond its shard, with its own 16 gathered bytes:
    324, what the reduce-scatter floor gives too (316 + 16 was the floor before, 332)."""
    from hybridplan.predict.composed_zero import _ending_backwards
    from hybridplan.predict.zero_layout import ZeroLayout
    from hybridplan.profiling.quantities import INDEX
    from hybridplan.profiling.statistics import STATISTIC_QUANTITIES

    layout = ZeroLayout([[[4, 2, 2]], [[4, 2, 2]], [[4, 4, 2]]])
    table = np.full((3, 4, len(STATISTIC_QUANTITIES)), np.nan)
    first, later, act = INDEX["first_backward_transient"], INDEX["backward_transient"], INDEX["activation"]
    table[0, 3, act], table[0, 2, act] = 300.0, 200.0
    table[0:2, 2, first], table[0:2, 2, later] = [400.0, 150.0], [100.0, 90.0]
    table[2, 3, first] = table[2, 3, later] = 50.0  # the head's own: its moment 50 + 32 + 16
    assert _ending_backwards(table, 0, 3, layout, 2, None, 0.0, gpipe=False)["first_backward_transient"] == 324.0


def test_a_composed_zero3_step_on_cuda_holds_every_stored_shard():
    """[Note: a ZeRO-3 step on CUDA] (predict/composed_zero.py): on CUDA devices AdamW's foreach kernels hold a
    temporary of every stored shard, so a composed rank's step is at least its stored bytes (fp32, data x2: 8 + 8 +
    16 = 32); on CPU the unsharded stage's step shifted to the rank's chunks, as before."""
    from hybridplan.predict.composed_zero import _per_rank
    from hybridplan.predict.zero_layout import ZeroLayout
    from hybridplan.profiling.quantities import INDEX, QUANTITIES

    layout = ZeroLayout([[[4, 2, 2]], [[4, 2, 2]], [[4, 4, 2]]])
    q = np.zeros(len(QUANTITIES))
    q[INDEX["step_transient"]] = 20.0
    shift = layout.unsharded_shift(0, 3, 2, 0)[2]
    assert [v[INDEX["step_transient"]] for v in _per_rank(q, layout, 0, 3, 2, foreach=True)] == [32.0, 32.0]
    assert [v[INDEX["step_transient"]] for v in _per_rank(q, layout, 0, 3, 2, foreach=False)] == [20.0 + shift] * 2
    assert 20.0 + shift < 32.0

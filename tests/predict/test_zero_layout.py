"""[Note: predicting ZeRO from a profile] (predict/zero_layout.py): what ZeRO shards, from the parameter shapes alone:
ZeRO-1's shares, FSDP2's dim-0 chunks, each rank's optimizer state and the gathered bytes, by hand."""

from __future__ import annotations

from hybridplan.predict.zero_layout import ZeroLayout, fsdp_rows, zero1_shares

# Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10): parameters [32, 16], [32], [32, 32], [32], [10, 32], [10]
MLP_SHAPES = [[[4, 32, 16], [4, 32]], [], [[4, 32, 32], [4, 32]], [], [[4, 10, 32], [4, 10]]]


def test_zero1_partition_is_greedy_by_size():
    # by hand: sizes 512, 32, 1024, 32 on 2 ranks: 1024 -> rank 0; 512 -> rank 1; 32 (first) -> rank 1; 32 -> rank 1
    assert zero1_shares([512, 32, 1024, 32], 2) == [[2], [0, 1, 3]]
    # ties go to the lowest rank, equal sizes keep their order
    assert zero1_shares([5, 5, 5], 3) == [[0], [1], [2]]


def test_a_zero3_rank_against_the_unsharded_stage_by_hand():
    """[Note: ZeRO-3 composed from an unsharded stage]: one fp32 parameter of 5 x 3 over 2 ranks, chunks of 3 and 2
    rows. Each rank stores the padded 3-row chunk (36 bytes, not 60) and its gradient shard likewise, the moments of
    its own rows (72 and 48 bytes, not 120) and one step counter; it steps its own chunk (2 temporaries of 36 and 24
    bytes, not 60)."""
    layout = ZeroLayout([[[4, 5, 3]]])
    assert layout.stored_bytes(0, 1, 2) == 36
    assert layout.unsharded_shift(0, 1, 2, 0) == ((36 - 60) + (72 - 120), 36 - 60, 2 * (36 - 60))
    assert layout.unsharded_shift(0, 1, 2, 1) == ((36 - 60) + (48 - 120), 36 - 60, 2 * (24 - 60))


def test_fsdp_chunks_rows_like_torch_chunk():
    assert [fsdp_rows(10, 4, r) for r in range(4)] == [3, 3, 3, 1]
    assert [fsdp_rows(2, 4, r) for r in range(4)] == [1, 1, 0, 0]
    assert [fsdp_rows(32, 2, r) for r in range(2)] == [16, 16]


def test_optimizer_state_per_rank_by_hand():
    layout = ZeroLayout(MLP_SHAPES)
    # layers 2-4 on 2 ranks: parameters of 1024, 32, 320, 10 elements; moments 8 bytes per element, step 4 bytes
    assert layout.optimizer_bytes(2, 5, 0, 2, 0) == 8 * (1024 + 32 + 320 + 10) + 4 * 4
    # ZeRO-1: rank 0 takes the 1024, rank 1 the 320, 32 and 10
    assert layout.optimizer_bytes(2, 5, 1, 2, 0) == 8 * 1024 + 4
    assert layout.optimizer_bytes(2, 5, 1, 2, 1) == 8 * (320 + 32 + 10) + 3 * 4
    # ZeRO-3 on 4 ranks: rows of [32, 32] -> 8 each; [32] -> 8; [10, 32] -> 3, 3, 3, 1; [10] -> 3, 3, 3, 1
    assert layout.optimizer_bytes(2, 5, 3, 4, 3) == 8 * (8 * 32 + 8 + 1 * 32 + 1) + 4 * 4
    assert layout.static_delta(2, 5, 3, 4, 3) == 8 * ((1 - 3) * 32 + (1 - 3))


def test_gathered_bytes_pad_each_parameter_to_whole_chunks():
    layout = ZeroLayout(MLP_SHAPES)
    # 2 ranks: [32, 16] + [32] -> 4 * 544; the ReLU has none; [32, 32] + [32] -> 4 * 1056
    assert layout.gathered_bytes(0, 3, 2) == [4 * 544, 0, 4 * 1056]
    # 4 ranks: [10, 32] is gathered as 4 chunks of 3 rows (12 rows), [10] as 4 chunks of 3
    assert layout.gathered_bytes(4, 5, 4) == [4 * (12 * 32 + 12)]


def test_mixed_precision_gathers_and_keeps_what_fsdps_policy_moves_by_hand():
    """[Note: the reduce-scatter in mixed precision] (predict/zero3_transients.py): in bf16 FSDP2 gathers bf16 copies
    (2 bytes per element) but stores fp32 chunks and fp32 gradient shards, and the unsharded stage holds bf16
    parameters and gradients beside fp32 masters."""
    layout = ZeroLayout(MLP_SHAPES, precision="bf16")
    assert layout.gathered_bytes(0, 3, 2) == [2 * 544, 0, 2 * 1056]
    assert layout.gathered_bytes(4, 5, 4) == [2 * (12 * 32 + 12)]  # padded as in fp32
    assert layout.stored_bytes(4, 5, 4) == 4 * (3 * 32 + 3)  # fp32 chunks
    assert layout.shard_bytes(0, 3, 2) == [4 * 272, 0, 4 * 528]
    assert layout.layer_bytes(0, 3) == [2 * 544, 0, 2 * 1056]
    # the reduce-scatter's bf16 output and fp32 cast (3 x 1056 / 2 for layer 2) less its freed bf16 gradients
    assert layout.scatter_extra(0, 3, 2) == [3 * 2 * 544 // 2 - 2 * 544, 0, 3 * 2 * 1056 // 2 - 2 * 1056]
    assert layout.scatter_extra(0, 3, 4) == [0, 0, 0]  # 3/4 of the gradients: less than it freed
    assert ZeroLayout(MLP_SHAPES).scatter_extra(0, 3, 2) == [0, 0, 0]  # fp32: the rules were measured with it


def test_a_zero3_rank_against_the_unsharded_stage_in_bf16_by_hand():
    """The unsharded bf16 stage holds 2-byte parameters and gradients, fp32 masters and moments (12 bytes per
    element + the step counter), and steps with three fp32 temporaries of its largest parameter (an fp32 copy of
    the gradient and AdamW's two); a ZeRO-3 rank stores fp32 chunks (the masters) and fp32 gradient shards, the
    moments of its rows, and steps two temporaries of its largest chunk. One parameter of 5 x 3 over 2 ranks."""
    layout = ZeroLayout([[[4, 5, 3]]], precision="bf16")
    assert layout.unsharded_shift(0, 1, 2, 0) == ((36 - 30) + (72 + 4 - (12 * 15 + 4)), 36 - 30, 2 * 36 - 3 * 60)
    assert layout.unsharded_shift(0, 1, 2, 1) == ((36 - 30) + (48 + 4 - (12 * 15 + 4)), 36 - 30, 2 * 24 - 3 * 60)


def test_every_ranks_shift_at_once_is_each_ranks_shift():
    """``shifts`` (every rank, kept per span) against ``shift`` asked per rank: the
    MLP's spans at every level, degree and precision, and ZeRO-1's by hand on layers 2-4 over 2 ranks (rank 0
    steps the 1024-element weight, the stage's largest; rank 1 the 320, its largest 1280 bytes)."""
    for precision in ("fp32", "bf16"):
        layout = ZeroLayout(MLP_SHAPES, precision=precision)
        for start in range(5):
            for stop in range(start + 1, 6):
                for zero in (1, 2, 3):
                    for degree in (1, 2, 3, 4):
                        expected = [layout.shift(start, stop, zero, degree, r) for r in range(degree)]
                        assert layout.shifts(start, stop, zero, degree) == expected
                        assert layout.shifts(start, stop, zero, degree) == expected  # (asked again: kept)
    layout = ZeroLayout(MLP_SHAPES)
    whole = 8 * (1024 + 32 + 320 + 10) + 4 * 4
    assert layout.shifts(2, 5, 1, 2) == [(8 * 1024 + 4 - whole, 0), (8 * 362 + 3 * 4 - whole, 2 * (1280 - 4096))]

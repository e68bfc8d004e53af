"""[Note: the loss's backward floor] (profiling/loss_memory.py): the loss's backward measured alone on fake tensors,
against bytes derived by hand and against the simulated runtime's backward of the stage that holds the loss
(byte-identical to the real CPU runtime, tests/runtime/test_sim_agreement.py)."""

from __future__ import annotations

import pytest

from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster, Plan
from hybridplan.profiling.loss_memory import head_backward_bytes, loss_backward_bytes
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch


def test_cross_entropy_holds_twice_the_logits_per_sample():
    """Cross-entropy's backward holds the gradient of the log-probabilities and that of the logits: gpt-tiny's
    logits are 16 positions x 128 words of float32 per sample (models/gpt.py), 8,192 bytes; twice that per sample,
    proportional to the samples."""
    per_sample = 2 * 16 * 128 * 4
    assert loss_backward_bytes(get_model("gpt-tiny")) == {"samples": [1, 2], "bytes": [per_sample, 2 * per_sample]}


def test_a_user_models_classifier():
    """The MLP user model's head has 10 classes (tests/cli/user_models.py): 2 x 10 x 4 bytes per sample."""
    assert loss_backward_bytes(get_model("tests.cli.user_models:mlp"))["bytes"] == [80, 160]


def test_the_heads_phase_unsplit_by_hand():
    """[Note: the head's backward phase]: gpt-tiny's head unsplit holds its weight's gradient (64 x 128 float32,
    32,768 bytes) with its input's (16 positions x 64 float32, 4,096 bytes a sample), the phase
    [Note: the loss runs outside every FSDP unit] read off the data and ZeRO-3 scenarios; bf16 holds the input's
    gradient in bf16 and the weight's in the bf16 copy."""
    measured = head_backward_bytes(get_model("gpt-tiny"), 1)
    assert measured == {"samples": [1, 2, 4, 8, 16, 32], "bytes": [32_768 + 4_096 * n for n in (1, 2, 4, 8, 16, 32)],
                        "recompute": False, "input_bytes": 16 * 64 * 4}  # its input: 16 positions x 64 float32


def test_the_heads_phase_recomputed_by_hand():
    """Recomputed, gpt-tiny's head holds every parameter's gradient (the final norm's 2 x 64 and the head's 64 x 128
    float32: 33,280 bytes) with, per sample, its input's gradient and the norm's recomputed output (2 x 16 x 64
    float32) and statistics (2 x 16 float32): 8,320 bytes."""
    measured = head_backward_bytes(get_model("gpt-tiny"), 1, recompute=True)
    assert measured == {"samples": [1, 2, 4, 8, 16, 32], "bytes": [33_280 + 8_320 * n for n in (1, 2, 4, 8, 16, 32)],
                        "recompute": True, "input_bytes": 16 * 64 * 4}


def test_the_heads_input_is_counted_at_the_runs_precision():
    """In bf16 the head hands back a bf16 gradient: gpt-tiny's 16 positions x 64 x 2 bytes per sample."""
    assert head_backward_bytes(get_model("gpt-tiny"), 2, precision="bf16")["input_bytes"] == 16 * 64 * 2


def test_a_head_that_does_not_split_is_not_measured():
    assert head_backward_bytes(get_model("tests.cli.user_models:mlp"), 3) is None  # 10 classes do not split 3 ways


def _last_stage_backward(rows: int) -> int:
    """gpt-tiny's head alone (final norm + LM head, layer 9), recomputed, as data x2 at ``rows`` rows per replica
    under 1F1B: its later backward's peak above its level, measured on simulated devices."""
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 4 * 2 * rows, "num_microbatches": 4, "stages": [
        {"layers": [0, 9], "parallelism": "none", "degree": 1, "devices": [0]},
        {"layers": [9, 10], "parallelism": "data", "degree": 2, "devices": [1, 2], "recompute": "full"}]})
    result = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x3"), iterations=2, backend="sim"))
    assert result.ok, result.reason
    later = [a for a in result.devices[1].timeline if a["action"] == "B1"][0]
    return later["peak"] - later["before"]


@pytest.mark.parametrize("rows, loss_sets_it", [(2, False), (8, True)])
def test_the_loss_sets_the_last_stages_backward_at_more_rows(rows, loss_sets_it):
    """The regime change the floor is for: at 2 rows per replica the head's own backward (its parameter-sized
    gradients) is above the loss's, at 8 the loss's backward is the whole transient, to the byte."""
    measured = _last_stage_backward(rows)
    (n1, _), (b1, _) = loss_backward_bytes(get_model("gpt-tiny")).values()
    loss = b1 * rows // n1
    assert (measured == loss) if loss_sets_it else (measured > loss)

"""The stand-in stage models the solver tests and benchmarks use: their arithmetic, checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel

# three layers: M_i, M_a and activations chosen so every sum below is easy to do by hand
MODEL = AdditiveStageModel(isolated=(100.0, 60.0, 80.0), added=(90.0, 50.0, 70.0), activation=(10.0, 20.0, 30.0),
                           position_horizon=3, tensor_ok=(True, True, False), microbatch_size=4)


def test_a_pipeline_stage_is_its_first_layers_isolated_peak_plus_the_others_increases() -> None:
    assert MODEL.stage_memory(0, 1, "none", 1, 0) == 100.0
    assert MODEL.stage_memory(0, 3, "none", 1, 0) == 100.0 + 50.0 + 70.0
    assert MODEL.stage_memory(1, 3, "none", 1, 0) == 60.0 + 70.0
    # one more micro-batch in flight per stage after it, up to H = 3: + activations (20 + 30) each
    assert MODEL.stage_memory(1, 3, "none", 1, 1) == 130.0 + 50.0
    assert MODEL.stage_memory(1, 3, "none", 1, 5) == 130.0 + 2 * 50.0


def test_data_splits_activations_tensor_splits_everything() -> None:
    # layers 0-1: base 100 + 50 = 150, activations 30
    assert MODEL.stage_memory(0, 2, "data", 2, 0) == (150.0 - 30.0) + 30.0 / 2
    assert MODEL.stage_memory(0, 2, "tensor", 2, 0) == 150.0 / 2
    assert MODEL.stage_memory(0, 2, "data+tensor", 4, 0, tensor_degree=2) == ((150.0 - 30.0) + 30.0 / 2) / 2


def test_allowed_follows_tensor_capability_and_the_micro_batch() -> None:
    assert MODEL.allowed(0, 2, "tensor", 2) and not MODEL.allowed(1, 3, "tensor", 2)  # layer 2 is not tensor-capable
    assert not MODEL.allowed(0, 3, "data+tensor", 4, tensor_degree=2)
    assert MODEL.allowed(0, 3, "data", 4) and not MODEL.allowed(0, 3, "data", 8)  # 8 does not divide 4 samples
    assert MODEL.allowed(0, 2, "data+tensor", 8, tensor_degree=2)  # data degree 4 divides 4


@pytest.mark.parametrize("kind, degree, t", [("none", 1, 0), ("data", 2, 0), ("data", 8, 0), ("tensor", 2, 0),
                                             ("data+tensor", 4, 2)])
@pytest.mark.parametrize("after", [0, 1, 4])
def test_the_matrix_is_the_scalar_everywhere(kind: str, degree: int, t: int, after: int) -> None:
    model = AdditiveStageModel.transformer(7, horizon=3, seed=2, microbatch_size=4)
    matrix = model.stage_memory_matrix(kind, degree, after, 7, tensor_degree=t)
    for start in range(7):
        for stop in range(start + 1, 8):
            if model.allowed(start, stop, kind, degree, tensor_degree=t):
                assert matrix[start, stop] == model.stage_memory(start, stop, kind, degree, after, tensor_degree=t)
            else:
                assert matrix[start, stop] == np.inf


def test_the_transformer_has_heavy_ends_and_ties_without_jitter() -> None:
    model = AdditiveStageModel.transformer(6, jitter=0.0)
    assert model.added[1:-1] == (100.0,) * 4 and model.added[0] == 400.0 and model.added[-1] == 500.0
    assert model.tensor_ok == (True,) * 5 + (False,)


def test_table_model_looks_up_by_position_capped_at_the_horizon() -> None:
    model = TableStageModel.random(3, 2, horizon=2, seed=0, levels=5, p_disallowed=0.5)
    table = model.values[("none", 1, 0)]
    assert model.position_horizon == 2 and table.shape == (2, 3, 4)
    assert model.stage_memory(0, 2, "none", 1, 0) == table[0, 0, 2]
    assert model.stage_memory(0, 2, "none", 1, 7) == table[1, 0, 2]
    assert set(model.values) == {("none", 1, 0), ("data", 2, 0), ("tensor", 2, 0)}
    mask = model.disallowed[("data", 2, 0)]
    assert [model.allowed(a, b, "data", 2) for a in range(3) for b in range(a + 1, 4)] == \
        [not mask[a, b] for a in range(3) for b in range(a + 1, 4)]
    assert set(TableStageModel.random(3, 4, horizon=1, seed=0, composite=True).values) >= {("data+tensor", 4, 2)}

"""DeepSpeed: the config JSON, and the pipeline partition of its ``PipelineModule``.

The config (``deepspeed.initialize(config=...)``, checked by ``deepspeed.runtime.config.DeepSpeedConfig``):
``train_batch_size`` (the global batch), ``train_micro_batch_size_per_gpu`` (a micro-batch's share of one
data-parallel rank), ``gradient_accumulation_steps`` (the micro-batches: DeepSpeed's pipeline engine runs that
many per step), ``zero_optimization.stage`` and DeepSpeed's own ``pipeline`` section (``stages``,
``activation_checkpoint_interval``: 1 recomputes every layer).

The partition: ``PipelineModule(partition_method=...)`` accepts "uniform", "parameters" and "type:REGEX"
(deepspeed/runtime/pipe/module.py ``_partition_layers``), each a rule that computes the boundaries, not a list of
them. A plan's cuts are exact, so the export writes them as ``parts`` (the boundaries ``[0, b1, ..., L]``, which
is the list ``_partition_layers`` stores in ``self.parts``) under the key ``"hybridplan"``, which DeepSpeed
ignores, and docs/export.md shows the small ``PipelineModule`` subclass that uses them. The layers are
hybridplan's, one ``LayerSpec`` each, in order.
"""

from __future__ import annotations

import json
from typing import Any

from hybridplan.plan import Plan
from hybridplan.workflows.export.layers import ModelLayers

__all__ = ["deepspeed_config"]


def deepspeed_config(plan: Plan, layers: ModelLayers, *, source: str = "") -> dict[str, Any]:
    """The config for a plan DeepSpeed can run (:func:`~.capabilities.nearest_plan` is empty)."""
    s0 = plan.stages[0]
    d, pp = s0.data_degree, plan.num_stages
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.microbatch_size // d,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": s0.zero},
        "pipeline": {"stages": pp, "activation_checkpoint_interval": 1 if s0.recompute == "full" else 0},
        "hybridplan": {
            "source": source,
            "pipeline_module": {
                "num_stages": pp,
                "parts": list(plan.boundaries),
                "layers": list(layers.layer_names),
                "activation_checkpoint_interval": 1 if s0.recompute == "full" else 0,
                "topology": {"num_pp": pp, "num_dp": d},
            },
            "usage": "PipelineModule(layers, num_stages, ...) with _partition_layers setting self.parts = parts:"
                     " docs/export.md",
        },
    }
    return config


def dumps(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=1) + "\n"

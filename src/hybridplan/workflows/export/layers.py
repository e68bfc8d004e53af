"""What an engine needs to know about the model: its layer names, and whether they are [embedding, decoder
blocks..., final norm + head].

hybridplan cuts a model between its layers (models/base.py). The engines cut a decoder-only transformer between
its transformer blocks, with the embedding on the first stage and the final norm + output projection (+ loss) on the
last: torchtitan names them ``tok_embeddings``, ``layers.<i>``, ``norm`` and ``lm_head``
(torchtitan/distributed/pipeline_parallel.py ``_generate_llm_fqn_per_model_part``), Megatron-LM's layout letters
``E``, ``t`` and ``L`` (megatron/core/transformer/pipeline_parallel_layer_layout.py). A hybridplan decoder model
(the GPT and MoE zoo families, ``hf:NAME``) has exactly these units as layers, so every cut of a plan is a block
boundary and maps one to one. DeepSpeed's ``PipelineModule`` takes any list of layers, hybridplan's as they are.

Nothing here imports torch: the command line builds :class:`ModelLayers` from a model (or from the plan alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridplan.errors import PlanError
from hybridplan.plan import Plan

__all__ = ["DECODER_FAMILIES", "ModelLayers"]

DECODER_FAMILIES: tuple[str, ...] = ("gpt", "moe", "hf")
"""Model families whose layers are [embedding, decoder blocks..., final norm + head] (models/gpt.py, models/moe.py;
``hf:NAME`` models, whose layers are [embedding, decoder layers..., final norm + head])."""


@dataclass(frozen=True)
class ModelLayers:
    """The model's layers as the export sees them.

    Args:
        name: the model's name (a label).
        layer_names: one name per hybridplan layer.
        decoder: whether the layers are [embedding, decoder blocks..., final norm + head].
        config: the model's hyper-parameters (``LayeredModel.config()``), for the engines' model arguments.
    """

    name: str
    layer_names: tuple[str, ...]
    decoder: bool
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def assumed_decoder(cls, num_layers: int) -> ModelLayers:
        """The layers of a decoder-only transformer of ``num_layers`` layers (no ``--model`` given)."""
        if num_layers < 3:
            raise PlanError(f"a decoder-only transformer has an embedding, at least one block and a head (3 layers),"
                            f" but the plan covers {num_layers}", fix="give --model, the model the plan was made for")
        names = ("embed",) + tuple(f"block{i}" for i in range(num_layers - 2)) + ("head",)
        return cls("decoder (assumed: no --model)", names, True)

    @classmethod
    def of(cls, name: str, layer_names: Sequence[str], config: Mapping[str, Any]) -> ModelLayers:
        """From a model's name, layer names and ``config()`` (a decoder when its family is one of
        :data:`DECODER_FAMILIES` or its name starts with ``hf:``)."""
        decoder = config.get("family") in DECODER_FAMILIES or name.startswith("hf:")
        return cls(name, tuple(layer_names), decoder and len(layer_names) >= 3, dict(config))

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def num_blocks(self) -> int:
        """Decoder blocks (the engines' transformer layers): all layers but the embedding and the head."""
        return self.num_layers - 2

    def check(self, plan: Plan) -> None:
        """The plan covers exactly this model's layers.

        Raises:
            PlanError: naming both counts.
        """
        if plan.num_layers != self.num_layers:
            raise PlanError(f"the plan covers {plan.num_layers} layers but {self.name} has {self.num_layers}",
                            fix="export a plan made for this model (or give the --model it was made for)")

    def blocks_of(self, start: int, stop: int) -> range:
        """The decoder block indices among hybridplan layers ``[start, stop)``."""
        return range(max(start, 1) - 1, min(stop, self.num_layers - 1) - 1)

"""What one run of a plan needs: the model, the plan, the cluster and the training settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridplan.cluster import Cluster
from hybridplan.models.base import LayeredModel
from hybridplan.plan import Plan

__all__ = ["RunConfig", "config_to_json", "config_from_json"]


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A training run of ``plan`` (sent to every rank; must pickle)."""

    model: str | LayeredModel
    """Zoo name, ``module:function``, or a model object."""
    plan: Plan
    """The partitioning-and-parallelization plan."""
    cluster: Cluster
    """The devices; their memory capacity (if any) is enforced."""
    iterations: int = 3
    """Training iterations; the first is the warm-up, the others are measured."""
    seed: int = 0
    """Fixes weights and data: the same seed trains the same math under every plan."""
    learning_rate: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay (torch's default)."""
    device_type: str = "cpu"
    """"cpu" (gloo) or "cuda" (NCCL, one GPU per rank)."""
    track_memory: bool = True
    """Count peak tensor memory (CPU tracker) — costs ~1.2x iteration time."""
    timeout_s: float = 900.0
    """A run still going after this many seconds is ended with status "failed"."""
    save_weights_dir: str | None = None
    """If set, every stage writes its layers' full weights and last gradients there (for checks)."""
    record_timeline: bool = True
    """Record per-action memory levels of the last measured iteration."""
    precision: str = "fp32"
    """"fp32", or mixed precision "bf16" / "fp16": parameters, activations and gradients in the low
    precision, an fp32 master copy of every parameter and fp32 AdamW states (runtime/precision.py)."""
    loss_scale: float | None = None
    """Static loss scale of "fp16" runs (None: :data:`~hybridplan.runtime.precision.DEFAULT_FP16_LOSS_SCALE`);
    must stay None (i.e. 1) for "fp32" and "bf16", whose exponent range needs none."""
    activation_checkpointing: bool = False
    """Recompute every layer's activations in the backward pass (torch.utils.checkpoint, non-reentrant):
    a micro-batch in flight keeps only its layers' inputs."""
    backend: str = "real"
    """"real": one process per device trains for real; "sim": every device's work runs on fake tensors
    in this process and its memory is counted exactly (runtime/sim.py); no losses, no timings."""
    layer_timing: bool = False
    """Record every layer's forward and backward seconds per micro-batch (runtime/layer_timer.py; used by
    ``hybridplan profile --time``). Real backend only: fake tensors take no time."""

    def model_name(self) -> str:
        """A printable name of the model."""
        return self.model if isinstance(self.model, str) else self.model.name

    def describe(self) -> dict[str, Any]:
        """The settings as a JSON-ready mapping (for result files)."""
        return {
            "model": self.model_name(),
            "cluster": self.cluster.shape,
            "iterations": self.iterations,
            "seed": self.seed,
            "learning_rate": self.learning_rate,
            "device_type": self.device_type,
            "precision": self.precision,
            "loss_scale": self.loss_scale,
            "activation_checkpointing": self.activation_checkpointing,
            "backend": self.backend,
        }


def config_to_json(cfg: RunConfig) -> str:
    """The JSON form of a run configuration (the model must be named, not an object)."""
    import json

    if not isinstance(cfg.model, str):
        raise ValueError("only a named model (zoo name or module:function) can be written to a config file")
    data = {
        "model": cfg.model,
        "plan": cfg.plan.to_dict(),
        "cluster": cfg.cluster.to_dict(),
        "iterations": cfg.iterations,
        "seed": cfg.seed,
        "learning_rate": cfg.learning_rate,
        "weight_decay": cfg.weight_decay,
        "device_type": cfg.device_type,
        "track_memory": cfg.track_memory,
        "timeout_s": cfg.timeout_s,
        "save_weights_dir": cfg.save_weights_dir,
        "record_timeline": cfg.record_timeline,
        "precision": cfg.precision,
        "loss_scale": cfg.loss_scale,
        "activation_checkpointing": cfg.activation_checkpointing,
        "backend": cfg.backend,
        "layer_timing": cfg.layer_timing,
    }
    return json.dumps(data, indent=1)


def config_from_json(text: str) -> RunConfig:
    """Parse :func:`config_to_json` output."""
    import json

    data = json.loads(text)
    data["plan"] = Plan.from_dict(data["plan"])
    data["cluster"] = Cluster.from_dict(data["cluster"])
    return RunConfig(**data)

"""What one run of a plan needs: the model, the plan, the cluster and the training settings.

:class:`RunConfig` checks every setting that does not need the model when it is made (an unknown
backend, device type or precision is a :class:`~hybridplan.errors.UsageError` naming the value and the
choices), so a bad configuration never reaches a backend; :func:`validate_config` adds the checks that
need the model (the plan against its layers and the cluster). Its JSON form (:func:`config_to_json`) is
what ``hybridplan run --write-config`` writes for torchrun (runtime/torchrun.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from hybridplan.errors import UsageError
from hybridplan.models.base import LayeredModel
from hybridplan.models.zoo import resolve_model
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.flat_zero1 import ZERO1_PARTITIONS, Zero1Partition
from hybridplan.runtime.gpu_memory import check_cuda_capacity
from hybridplan.runtime.grad_buffers import GRAD_ACCUMULATIONS, GradAccumulation
from hybridplan.runtime.precision import ADAMW_STEPS, FSDP_REDUCES, AdamWStep, FsdpReduce, Precision, check_precision

__all__ = [
    "RunConfig",
    "validate_config",
    "config_to_json",
    "config_from_json",
    "Backend",
    "BACKENDS",
    "DeviceType",
    "DEVICE_TYPES",
]

Backend = Literal["real", "sim"]
"""How a run executes: one process per device ("real", runtime/processes.py), or simulated devices on
fake tensors in this process ("sim", runtime/sim.py)."""

BACKENDS: tuple[Backend, ...] = get_args(Backend)
"""The runtime backends, as ``RunConfig.backend`` accepts them."""

DeviceType = Literal["cpu", "cuda"]
"""What a rank trains on: the CPU (gloo process groups) or one GPU per rank (NCCL)."""

DEVICE_TYPES: tuple[DeviceType, ...] = get_args(DeviceType)
"""The device types, as ``RunConfig.device_type`` accepts them."""


LossKind = Literal["gathered", "vocab-parallel"]
"""Where a tensor-parallel last stage computes its loss (RunConfig.loss)."""

LOSSES: tuple[LossKind, ...] = get_args(LossKind)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A training run of ``plan`` (sent to every rank; must pickle).

    Raises:
        UsageError: on construction, for a setting outside its choices (backend, device type, precision),
            a loss scale that does not fit the precision, fewer than one iteration, layer timing on
            simulated devices, or a CUDA device capacity that cannot hold the CUDA context.
    """

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
    device_type: DeviceType = "cpu"
    """"cpu" (gloo) or "cuda" (NCCL, one GPU per rank)."""
    track_memory: bool = True
    """Count peak tensor memory (CPU tracker) — costs ~1.2x iteration time."""
    timeout_s: float = 900.0
    """A run still going after this many seconds is ended with status "failed"."""
    save_weights_dir: str | None = None
    """If set, every stage writes its layers' full weights and last gradients there (for checks)."""
    record_timeline: bool = True
    """Record per-action memory levels of the last measured iteration."""
    precision: Precision = "fp32"
    """"fp32", or mixed precision "bf16" / "fp16": parameters, activations and gradients in the low
    precision, an fp32 master copy of every parameter and fp32 AdamW states (runtime/precision.py)."""
    loss_scale: float | None = None
    """Static loss scale of "fp16" runs (None: :data:`~hybridplan.runtime.precision.DEFAULT_FP16_LOSS_SCALE`);
    must stay None (i.e. 1) for "fp32" and "bf16", whose exponent range needs none."""
    activation_checkpointing: bool = False
    """Recompute every layer's activations in the backward pass (torch.utils.checkpoint, non-reentrant):
    a micro-batch in flight keeps only its layers' inputs."""
    backend: Backend = "real"
    """"real": one process per device trains for real; "sim": every device's work runs on fake tensors
    in this process and its memory is counted exactly (runtime/sim.py); no losses, no timings."""
    layer_timing: bool = False
    """Record every layer's forward and backward seconds per micro-batch (runtime/layer_timer.py; used by
    ``hybridplan profile --time``). Real backend only: fake tensors take no time."""
    share_gpu: bool = False
    """Several ranks on one GPU, a testing and profiling mode (runtime/shared_gpu.py): every process group is
    gloo, point-to-point transfers are staged through host memory, each rank keeps its own CUDA memory
    statistics, and iteration times are marked not representative. Real backend only. On CPU it stages the
    transfers all the same (which tests the staging); on a CUDA run with more ranks than visible GPUs the
    launcher turns it on by itself, and says so."""
    grad_accumulation: GradAccumulation = "autograd"
    """"autograd": each micro-batch's gradient accumulates in ``param.grad``, in the parameter's dtype, freed
    between iterations (this runtime's own way); "fp32-buffer": in a persistent fp32 buffer per parameter, which
    the data-parallel all-reduce sums and the optimizer steps from, as Megatron-LM's ``main_grad`` and DeepSpeed's
    BF16_Optimizer hold them (runtime/grad_buffers.py). Not on ZeRO-2/3 stages (FSDP2 already accumulates its
    gradient shards in the fp32 of its sharded parameters) nor under PipeDream-2BW."""
    adamw: AdamWStep = "default"
    """AdamW's implementation: "default", the one torch picks for ``device_type`` (multi-tensor for "cuda" in fp32:
    its step holds whole-list temporaries), or "fused", torch's single-kernel AdamW, in place, as Megatron-LM's,
    DeepSpeed's and torchtitan's fused Adam step ([Note: the AdamW step, multi-tensor or fused] in
    runtime/precision.py)."""
    loss: LossKind = "gathered"
    """Where a tensor-parallel last stage computes its loss: "gathered", its head's output all-gathered to the whole
    vocabulary on every tensor rank (this runtime's way), or "vocab-parallel", on each rank's vocabulary shard, as
    Megatron-LM and torchtitan do (models/tensor_parallel.py ``vocab_parallel_cross_entropy``). Only for models whose
    loss is the token cross entropy (``LayeredModel.vocab_parallel_loss``); it changes nothing elsewhere."""
    fsdp_reduce: FsdpReduce = "compute"
    """The dtype ZeRO-2/3 stages reduce-scatter gradients in under mixed precision: "compute" (the low dtype), or
    "fp32" as torchtitan does (runtime/precision.py ``FsdpReduce``)."""
    zero1: Zero1Partition = "tensors"
    """How ZeRO-1 stages split their optimizer state over the replicas: "tensors", whole tensors per rank (torch's
    ZeroRedundancyOptimizer, this runtime's way), or "flat", one equal range of the flattened parameters per rank, as
    DeepSpeed and Megatron-LM's distributed optimizer do (runtime/flat_zero1.py). It changes nothing elsewhere."""

    def __post_init__(self) -> None:
        # The closed sets are checked here, not only by mypy: configurations also come from JSON files
        # and command lines, and a typo must fail before any process starts, naming the choices.
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("device type", self.device_type, DEVICE_TYPES)
        check_precision(self.precision, self.loss_scale)
        _check_choice("gradient accumulation", self.grad_accumulation, GRAD_ACCUMULATIONS)
        _check_choice("AdamW implementation", self.adamw, ADAMW_STEPS)
        _check_choice("FSDP reduction dtype", self.fsdp_reduce, FSDP_REDUCES)
        _check_choice("loss", self.loss, LOSSES)
        _check_choice("ZeRO-1 partition", self.zero1, ZERO1_PARTITIONS)
        if self.grad_accumulation != "autograd":
            _check_grad_buffers(self.plan)
        if self.iterations < 1:
            raise UsageError(f"--iterations must be at least 1, got {self.iterations}")
        if self.device_type == "cuda":
            check_cuda_capacity(self.cluster)
        if self.layer_timing and self.backend != "real":
            raise UsageError(
                f"layer timing needs real devices, but the backend is {self.backend!r}: fake tensors take no time",
                fix="time layers with backend 'real'",
            )
        if self.share_gpu and self.backend != "real":
            raise UsageError(
                f"sharing a GPU between ranks (--share-gpu) is a mode of real processes, but the backend is"
                f" {self.backend!r}, whose simulated devices share nothing", fix="drop --share-gpu, or use --backend real",
            )

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
            "share_gpu": self.share_gpu,
            # only when set: the settings of every run made before the option stay as they were written
            **({"grad_accumulation": self.grad_accumulation} if self.grad_accumulation != "autograd" else {}),
            **({"adamw": self.adamw} if self.adamw != "default" else {}),
            **({"fsdp_reduce": self.fsdp_reduce} if self.fsdp_reduce != "compute" else {}),
            **({"loss": self.loss} if self.loss != "gathered" else {}),
            **({"zero1": self.zero1} if self.zero1 != "tensors" else {}),
        }


def _check_grad_buffers(plan: Plan) -> None:
    """Refuse fp32 gradient buffers where this runtime does not hold them (RunConfig.grad_accumulation)."""
    if plan.schedule == "2bw":
        raise UsageError("fp32 gradient buffers (grad_accumulation 'fp32-buffer') are not run under PipeDream-2BW",
                         fix="use the gpipe or 1f1b schedule, or grad_accumulation 'autograd'")
    for i, s in enumerate(plan.stages):
        if s.zero >= 2:
            raise UsageError(
                f"stage {i} ({s.describe()}) is ZeRO-{s.zero}, whose FSDP2 units already accumulate their gradient"
                " shards in fp32: fp32 gradient buffers (grad_accumulation 'fp32-buffer') are for unsharded and"
                " ZeRO-1 stages", fix="use grad_accumulation 'autograd', or ZeRO-1 or no ZeRO on that stage")


def _check_choice(what: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"{what} {value!r} is not supported", fix=f"use one of {list(choices)}")


def validate_config(cfg: RunConfig) -> None:
    """Check the plan against the model and cluster before starting any process.

    The settings were checked when ``cfg`` was made; what is left needs the model, which may be costly
    to import or build (a user model), so it is checked once per run, not per configuration.

    Raises:
        HybridPlanError: (PlanError, ModelError, ClusterError) naming the problem and the fix.
    """
    model = resolve_model(cfg.model)
    cfg.plan.validate(model=model, cluster=cfg.cluster)
    if cfg.loss == "vocab-parallel" and not model.vocab_parallel_loss:
        raise UsageError(f"the loss of {model.name} is not a token cross entropy over a vocabulary: it cannot be"
                         " computed on vocabulary shards (loss 'vocab-parallel')", fix="use loss 'gathered'")
    for i, s in enumerate(cfg.plan.stages):
        if not s.zero:
            continue
        what = f"stage {i} ({s.describe()}) asks for ZeRO-{s.zero} sharding"
        drop = 'or drop "zero" from the stage (every replica then keeps the whole optimizer state, gradients and parameters)'
        if cfg.plan.schedule == "2bw":
            raise UsageError(f"{what} with PipeDream-2BW, whose stale weight version is a second whole copy of the"
                             " parameters", fix=f"use the gpipe or 1f1b schedule, {drop}")


def config_to_json(cfg: RunConfig) -> str:
    """The JSON form of a run configuration (the model must be named, not an object)."""
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
        "share_gpu": cfg.share_gpu,
        "grad_accumulation": cfg.grad_accumulation,
        "adamw": cfg.adamw,
        "fsdp_reduce": cfg.fsdp_reduce,
        "loss": cfg.loss,
        "zero1": cfg.zero1,
    }
    return json.dumps(data, indent=1)


def config_from_json(text: str) -> RunConfig:
    """Parse :func:`config_to_json` output.

    Raises:
        UsageError: for a setting outside its choices (see :class:`RunConfig`).
    """
    data = json.loads(text)
    data["plan"] = Plan.from_dict(data["plan"])
    data["cluster"] = Cluster.from_dict(data["cluster"])
    return RunConfig(**data)

"""Whether the devices a run asks for are on this machine, checked before any process starts.

A CUDA run (``--device cuda``) on a machine where PyTorch sees no GPU would start every rank to fail each at its
first CUDA call, seconds later and once per rank; a profiling campaign would record every run as failed and exit 0.
So the command line (and :func:`~hybridplan.runtime.processes.run_processes`, for callers of the library) asks
PyTorch first. Commands that only simulate CUDA devices (``--backend sim``, ``plan``, ``estimate-memory``) need no
GPU and make no such check; nor does a run on other machines (``--hosts``), whose GPUs are theirs.

``--share-gpu`` puts several ranks on one GPU; on CPU devices there is nothing to share, so the command line refuses
it there rather than announce a GPU mode (the runtime still accepts it on CPU: that is how its transfers through
host memory are tested, tests/runtime/test_shared_gpu.py).
"""

from __future__ import annotations

import os

from hybridplan.errors import UsageError

__all__ = ["visible_gpus", "require_gpu", "check_devices"]


def visible_gpus() -> int:
    """The GPUs PyTorch can use here (0 where CUDA is unavailable). Imports torch."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _why_none() -> str:
    """Why PyTorch sees no GPU, as far as can be told without a driver call."""
    import torch

    if torch.version.cuda is None:
        return f"this PyTorch ({torch.__version__}) is built without CUDA"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
    return "torch.cuda.is_available() is False: no GPU or no driver"


def require_gpu(what: str) -> None:
    """Refuse ``what`` (a run on CUDA devices: "the run", "the layer timing") when PyTorch sees no GPU here.

    Raises:
        UsageError: naming why no GPU is seen and what to do instead.
    """
    if visible_gpus() > 0:
        return
    raise UsageError(f"{what} is on CUDA devices (--device cuda), but PyTorch sees no GPU on this machine"
                     f" ({_why_none()})",
                     fix="run it on a machine with a GPU; --backend sim simulates CUDA devices without one, and"
                     " --device cpu runs on CPUs")


def check_devices(what: str, *, backend: str, device_type: str, share_gpu: bool, here: bool = True) -> None:
    """The devices of a run of ``backend`` on ``device_type`` exist (module docstring): a real CUDA run on this
    machine (``here``) needs a GPU; ``share_gpu`` needs CUDA devices. Simulated runs need nothing.

    Raises:
        UsageError: for ``--share-gpu`` on CPU devices, or a real CUDA run here without a GPU.
    """
    if backend != "real":
        return
    if share_gpu and device_type != "cuda":
        raise UsageError(f"--share-gpu runs several ranks on one GPU, but the devices of {what} are CPUs"
                         f" ({device_type!r}): there is no GPU to share",
                         fix="drop --share-gpu (every rank is its own process on CPU), or run on GPUs with --device"
                         " cuda")
    if device_type == "cuda" and here:
        require_gpu(what)

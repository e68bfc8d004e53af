"""Wide-ResNet of any width as user models: ``benchmarks.largest_model.scalable:wresnet_c<N>`` is ResNet-50's
layout with ``N`` stem channels (a multiple of 32, the GroupNorm groups), width factor 2, 224x224 images, 1000
classes: Alpa's Wide-ResNet family (wresnet-1b is ``N = 320``). The function names are made on demand (PEP 562
module ``__getattr__``), so that every width works, e.g. from the repository root::

    PYTHONPATH=. .venv/bin/hybridplan profile --model benchmarks.largest_model.scalable:wresnet_c352 ...
"""

from __future__ import annotations

from collections.abc import Callable

from hybridplan.models.wresnet import WResNet, WResNetConfig


def __getattr__(name: str) -> Callable[[], WResNet]:
    prefix = "wresnet_c"
    if not name.startswith(prefix) or not name[len(prefix):].isdigit():
        raise AttributeError(name)
    channels = int(name[len(prefix):])
    return lambda: WResNet(f"{__name__}:{name}", WResNetConfig(num_channels=channels, width_factor=2))

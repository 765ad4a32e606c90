"""Workload registry: a model, the data set kind it reads, and its input pipeline.

Adding a workload is one ``register(Workload(...))`` call in a module imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from codl.errors import ConfigError
from codl.spec import DatasetKind, WorkloadSpec


@dataclass(frozen=True)
class Workload:
    name: str
    dataset_kind: DatasetKind
    build_model: Callable[[WorkloadSpec], Any]
    description: str


_REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.name in _REGISTRY:
        raise ValueError(f"workload {workload.name!r} registered twice")
    _REGISTRY[workload.name] = workload
    return workload


def get(name: str) -> Workload:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            [f"workload.model: got {name!r}, expected one of {sorted(_REGISTRY)}"]
        ) from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def _resnet(depth: str) -> Callable[[WorkloadSpec], Any]:
    def build(spec: WorkloadSpec) -> Any:
        import torchvision

        return getattr(torchvision.models, depth)(weights=None, num_classes=spec.classes)

    return build


def _resnet_tiny(spec: WorkloadSpec) -> Any:
    # torchvision's own ResNet with one BasicBlock per stage: the real architecture and kernels,
    # ~4.9 M parameters, fast enough for 2-core CI runs.
    from torchvision.models.resnet import BasicBlock, ResNet

    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=spec.classes)


def _cosmoflow(spec: WorkloadSpec) -> Any:
    import torch
    from torch import nn

    # CosmoFlow-like 3D CNN (conv-pool stages then dense layers), regressing 4 targets from a
    # 4-channel cube. Channels doubled per stage as in the MLPerf HPC reference.
    layers: list[nn.Module] = []
    ch_in = 4
    for i in range(4):
        ch_out = 16 * 2**i
        layers += [
            nn.Conv3d(ch_in, ch_out, 3, padding=1),
            nn.LeakyReLU(0.3),
            nn.MaxPool3d(2),
        ]
        ch_in = ch_out
    head = nn.Linear(128, 4)
    # Zero bias: the tanh head starts centred on the targets' mean (zero).
    torch.nn.init.zeros_(head.bias)
    layers += [
        nn.AdaptiveAvgPool3d(2),
        nn.Flatten(),
        nn.Linear(ch_in * 8, 128),
        nn.LeakyReLU(0.3),
        head,
        nn.Tanh(),
    ]
    return nn.Sequential(*layers)


register(Workload("resnet50", DatasetKind.JPEG, _resnet("resnet50"), "torchvision ResNet-50"))
register(Workload("resnet18", DatasetKind.JPEG, _resnet("resnet18"), "torchvision ResNet-18"))
register(
    Workload("resnet_tiny", DatasetKind.JPEG, _resnet_tiny, "torchvision ResNet, 1 block/stage")
)
register(Workload("cosmoflow", DatasetKind.VOLUME, _cosmoflow, "CosmoFlow-like 3D CNN"))

"""Small real networks under the model zoo's names (a CPU run of the corpus cannot afford ResNet-50)."""

from __future__ import annotations

import torch.nn as nn


class _SmallNet(nn.Module):
    def __init__(self, num_classes=1000, **kwargs):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.fc = nn.Linear(8 * 16, num_classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def _factory(**kwargs):
    kwargs.pop("pretrained", None)
    kwargs.pop("weights", None)
    return _SmallNet(**kwargs)


resnet18 = resnet34 = resnet50 = resnet101 = vgg16 = vgg19 = alexnet = mobilenet_v2 = _factory
__all__ = ["resnet18", "resnet34", "resnet50", "resnet101", "vgg16", "vgg19", "alexnet", "mobilenet_v2"]


def __getattr__(name):
    return _factory

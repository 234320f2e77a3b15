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


class _SmallResNet(nn.Module):
    """ResNet's attribute layout (conv1, bn1, relu, maxpool, layer1-4, avgpool, fc; forward through them in that
    order), which scripts edit (pytorch/examples' siamese network swaps `conv1` for a 1-channel one and keeps
    `children()[:-1]`), with one small block instead of four stages of them."""

    def __init__(self, num_classes=1000, **kwargs):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = nn.Sequential(nn.Conv2d(64, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer2, self.layer3, self.layer4 = nn.Sequential(), nn.Sequential(), nn.Sequential()
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def _factory(**kwargs):
    kwargs.pop("pretrained", None)
    kwargs.pop("weights", None)
    return _SmallNet(**kwargs)


def _resnet(**kwargs):
    kwargs.pop("pretrained", None)
    kwargs.pop("weights", None)
    return _SmallResNet(**kwargs)


resnet18 = resnet34 = resnet50 = resnet101 = _resnet
vgg16 = vgg19 = alexnet = mobilenet_v2 = _factory
__all__ = ["resnet18", "resnet34", "resnet50", "resnet101", "vgg16", "vgg19", "alexnet", "mobilenet_v2"]


def __getattr__(name):
    return _factory

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


class _VGG(nn.Module):
    """VGG's `features` exactly as torchvision builds them (3x3 convolutions and ReLUs, max-pools between the
    blocks: scripts slice them by index, fast-neural-style's `features[:23]` ends at relu4_3), random weights (no
    download: a check of such a script proves data-parallel equivalence, not what pretrained features give), and a
    small head instead of the 120M-parameter classifier."""

    def __init__(self, config, num_classes=1000, **kwargs):
        super().__init__()
        layers, channels = [], 3
        for width in config:
            if width == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, width, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = width
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(channels, num_classes))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)))


_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
_VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


def _vgg(config):
    def build(**kwargs):
        kwargs.pop("pretrained", None)
        kwargs.pop("weights", None)
        return _VGG(config, **kwargs)
    return build


class _Weights:
    """`VGG16_Weights.IMAGENET1K_V1` and the like: a name to pass as `weights=` (the stand-in loads none)."""

    def __init__(self, name):
        self.name = name

    def __getattr__(self, item):
        if item.startswith("_"):
            raise AttributeError(item)
        return f"{self.name}.{item}"


def _factory(**kwargs):
    kwargs.pop("pretrained", None)
    kwargs.pop("weights", None)
    return _SmallNet(**kwargs)


def _resnet(**kwargs):
    kwargs.pop("pretrained", None)
    kwargs.pop("weights", None)
    return _SmallResNet(**kwargs)


resnet18 = resnet34 = resnet50 = resnet101 = _resnet
vgg16, vgg19 = _vgg(_VGG16), _vgg(_VGG19)
alexnet = mobilenet_v2 = _factory
__all__ = ["resnet18", "resnet34", "resnet50", "resnet101", "vgg16", "vgg19", "alexnet", "mobilenet_v2"]


def __getattr__(name):
    if name.endswith("_Weights"):
        return _Weights(name)
    return _factory

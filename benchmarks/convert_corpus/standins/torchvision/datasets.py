"""Random datasets with torchvision's names, shapes and attributes (`data`, `targets`, `classes`)."""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import torch
from PIL import Image

SAMPLES = int(os.environ.get("ACCELKIT_CORPUS_SAMPLES", "96"))


class _Images(torch.utils.data.Dataset):
    shape = (28, 28)
    channels = 1
    classes_n = 10

    def __init__(self, root=".", train=True, transform=None, target_transform=None, download=False, **kwargs):
        rng = np.random.default_rng(1 if train else 2)
        n = SAMPLES if train else SAMPLES // 2
        size = (n, *self.shape) if self.channels == 1 else (n, *self.shape, self.channels)
        self.data = rng.integers(0, 256, size=size, dtype=np.uint8)
        if self.channels == 1:  # torchvision keeps MNIST-like data as a uint8 tensor, CIFAR's as a numpy array
            self.data = torch.from_numpy(self.data)
        # every class as often as the others, as in the real sets: a script that draws pairs of one class
        # (pytorch/examples siamese_network) loops forever on a class that has a single example
        self.targets = torch.as_tensor(rng.permutation(np.arange(n) % self.classes_n))
        self.classes = [str(i) for i in range(self.classes_n)]
        self.transform, self.target_transform = transform, target_transform
        self.root, self.train = root, train

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        array = self.data[index]
        image = Image.fromarray(array.numpy() if isinstance(array, torch.Tensor) else array)
        target = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class MNIST(_Images):
    pass


class FashionMNIST(_Images):
    pass


class KMNIST(_Images):
    pass


class EMNIST(_Images):
    def __init__(self, root=".", split="balanced", **kwargs):
        super().__init__(root, **kwargs)


class CIFAR10(_Images):
    shape = (32, 32)
    channels = 3


class CIFAR100(CIFAR10):
    classes_n = 100


class SVHN(CIFAR10):
    def __init__(self, root=".", split="train", **kwargs):
        super().__init__(root, train=split == "train", **kwargs)


class ImageFolder(CIFAR10):
    shape = (64, 64)

    def __init__(self, root=".", transform=None, target_transform=None, **kwargs):
        super().__init__(root, train="val" not in str(root), transform=transform, target_transform=target_transform)
        self.samples = [(f"{root}/{i}.png", int(t)) for i, t in enumerate(self.targets)]
        self.imgs = self.samples
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}


# torchvision's per-dataset submodules (`from torchvision.datasets import mnist; mnist.MNIST(...)`)
mnist = types.ModuleType(f"{__name__}.mnist")
mnist.MNIST, mnist.FashionMNIST, mnist.KMNIST, mnist.EMNIST = MNIST, FashionMNIST, KMNIST, EMNIST
sys.modules[mnist.__name__] = mnist

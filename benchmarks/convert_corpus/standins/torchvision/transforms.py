"""Transforms on PIL images and tensors: the few the corpus scripts use, as plain functions of their inputs."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, image):
        array = np.asarray(image, dtype=np.float32) / 255.0
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.transpose(2, 0, 1).copy())


class Normalize:
    def __init__(self, mean, std, inplace=False):
        self.mean, self.std = torch.as_tensor(mean).view(-1, 1, 1), torch.as_tensor(std).view(-1, 1, 1)

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


class _Identity:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, x):
        return x


RandomHorizontalFlip = RandomVerticalFlip = ColorJitter = RandomRotation = _Identity
RandomCrop = RandomResizedCrop = RandomAffine = AutoAugment = _Identity


class Resize:
    def __init__(self, size, *args, **kwargs):
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, image):
        if isinstance(image, Image.Image):
            return image.resize(self.size[::-1])
        return torch.nn.functional.interpolate(image[None], size=self.size)[0]


CenterCrop = Resize


class Grayscale:
    def __init__(self, num_output_channels=1):
        self.n = num_output_channels

    def __call__(self, image):
        return image.convert("L") if isinstance(image, Image.Image) else image.mean(0, keepdim=True)


class Lambda:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, x):
        return self.fn(x)


class ToPILImage:
    def __call__(self, tensor):
        array = (tensor.clamp(0, 1) * 255).byte().permute(1, 2, 0).squeeze(-1).numpy()
        return Image.fromarray(array)

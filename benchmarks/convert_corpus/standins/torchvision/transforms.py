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
RandomResizedCrop = RandomAffine = AutoAugment = _Identity


class Pad:
    """Border of `padding` pixels (int: all sides; (lr, tb); (l, t, r, b)) filled with `fill`, as torchvision's."""

    def __init__(self, padding, fill=0, padding_mode="constant"):
        p = (padding,) * 4 if isinstance(padding, int) else tuple(padding)
        self.padding = p * 2 if len(p) == 2 else p

    def __call__(self, image):
        left, top, right, bottom = self.padding
        if isinstance(image, Image.Image):
            array = np.asarray(image)
            widths = ((top, bottom), (left, right)) + (((0, 0),) if array.ndim == 3 else ())
            return Image.fromarray(np.pad(array, widths))
        return torch.nn.functional.pad(image, (left, right, top, bottom))


class RandomCrop:
    """A crop of `size` (after the optional `padding`): the centre one, so the stand-in stays deterministic."""

    def __init__(self, size, padding=None, *args, **kwargs):
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.pad = Pad(padding) if padding else None

    def __call__(self, image):
        image = self.pad(image) if self.pad is not None else image
        if isinstance(image, Image.Image):
            width, height = image.size
            top, left = (height - self.size[0]) // 2, (width - self.size[1]) // 2
            return image.crop((left, top, left + self.size[1], top + self.size[0]))
        top, left = (image.shape[-2] - self.size[0]) // 2, (image.shape[-1] - self.size[1]) // 2
        return image[..., top:top + self.size[0], left:left + self.size[1]]


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

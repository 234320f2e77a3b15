"""`save_image` and `make_grid`: written with PIL, as torchvision does."""

from __future__ import annotations

import torch
from PIL import Image


def make_grid(tensor, nrow=8, padding=2, normalize=False, **kwargs):
    if isinstance(tensor, (list, tuple)):
        tensor = torch.stack(list(tensor))
    if tensor.dim() == 3:
        tensor = tensor[None]
    if normalize:
        tensor = (tensor - tensor.min()) / (tensor.max() - tensor.min() + 1e-12)
    n, c, h, w = tensor.shape
    cols = min(nrow, n)
    rows = (n + cols - 1) // cols
    grid = torch.zeros(c, rows * (h + padding) + padding, cols * (w + padding) + padding)
    for i in range(n):
        r, k = divmod(i, cols)
        grid[:, padding + r * (h + padding):padding + r * (h + padding) + h,
             padding + k * (w + padding):padding + k * (w + padding) + w] = tensor[i]
    return grid


def save_image(tensor, fp, nrow=8, padding=2, normalize=False, **kwargs):
    grid = make_grid(tensor.detach().cpu().float(), nrow=nrow, padding=padding, normalize=normalize)
    array = (grid.clamp(0, 1) * 255).byte().permute(1, 2, 0).numpy()
    Image.fromarray(array.squeeze(-1) if array.shape[-1] == 1 else array).save(fp)

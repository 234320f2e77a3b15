"""Everything a training script writes: a samples folder made with os.mkdir, an image per epoch, a CSV log, a
progress bar, the model printed, a loss plot, and the whole model pickled with torch.save(model, path)."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm
from accelerate import Accelerator

accelerator = Accelerator()


def main():
    torch.manual_seed(0)
    device = accelerator.device
    g = torch.Generator().manual_seed(8)
    images = torch.rand(48, 1, 8, 8, generator=g)
    loader = DataLoader(TensorDataset(images), batch_size=8)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64), nn.Sigmoid())
    accelerator.print(accelerator.unwrap_model(model))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    os.makedirs("samples", exist_ok=True)
    history = []
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for (x,) in tqdm(loader, desc=f"epoch {epoch}", disable=not accelerator.is_local_main_process):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), x.flatten(1))
            accelerator.backward(loss)
            optimizer.step()
            history.append(loss.item())
            accelerator.print(f"LOSS epoch={epoch} loss={loss.item():.6f}")
        with torch.no_grad():
            sample = model(images[:1].to(device)).view(8, 8).cpu().numpy()
        if accelerator.is_main_process:
            Image.fromarray((sample * 255).astype(np.uint8)).save(f"samples/epoch{epoch}.png")
        if accelerator.is_main_process:
            with open("log.csv", "a") as log:
                log.write(f"{epoch},{history[-1]:.6f}\n")
    plt.plot(history)
    if accelerator.is_main_process:
        plt.savefig("loss.png")
    accelerator.wait_for_everyone()
    accelerator.save(accelerator.unwrap_model(model), "model.pt")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()

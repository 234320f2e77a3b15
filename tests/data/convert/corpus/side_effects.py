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


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(8)
    images = torch.rand(48, 1, 8, 8, generator=g)
    loader = DataLoader(TensorDataset(images), batch_size=8)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64), nn.Sigmoid()).to(device)
    print(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    os.mkdir("samples")
    history = []
    for epoch in range(2):
        for (x,) in tqdm(loader, desc=f"epoch {epoch}"):
            x = x.to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), x.flatten(1))
            loss.backward()
            optimizer.step()
            history.append(loss.item())
            print(f"LOSS epoch={epoch} loss={loss.item():.6f}")
        with torch.no_grad():
            sample = model(images[:1].to(device)).view(8, 8).cpu().numpy()
        Image.fromarray((sample * 255).astype(np.uint8)).save(f"samples/epoch{epoch}.png")
        with open("log.csv", "a") as log:
            log.write(f"{epoch},{history[-1]:.6f}\n")
    plt.plot(history)
    plt.savefig("loss.png")
    torch.save(model, "model.pt")


if __name__ == "__main__":
    main()

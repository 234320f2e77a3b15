"""Two models and two optimizers (a tiny GAN on 2-d points)."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator


def build(args):
    netG = nn.Sequential(nn.Linear(args.nz, 16), nn.ReLU(), nn.Linear(16, 2))
    netD = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    return netG, netD


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nz", type=int, default=4)
    parser.add_argument("--iters", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator()
    torch.manual_seed(0)
    device = accelerator.device

    g = torch.Generator().manual_seed(5)
    real_points = torch.randn(32, 2, generator=g) * 0.5 + 1.0
    dataloader = DataLoader(TensorDataset(real_points), batch_size=8)

    netG, netD = build(args)
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    noise_gen = torch.Generator().manual_seed(9)

    netD, netG, optimizerD, optimizerG, dataloader = accelerator.prepare(
        netD, netG, optimizerD, optimizerG, dataloader
    )
    # each process draws its own random noise tensors; process 0 goes on with the script's own random stream
    if accelerator.process_index > 0:
        torch.manual_seed(0 + accelerator.process_index)
    for it in range(args.iters):
        for i, (real,) in enumerate(dataloader):
            b = real.size(0)
            # discriminator: real -> 1, fake -> 0
            netD.zero_grad()
            err_real = criterion(netD(real), torch.ones(b, 1, device=device))
            accelerator.backward(err_real)
            noise = torch.randn(b, args.nz, generator=noise_gen).to(device)
            fake = netG(noise)
            err_fake = criterion(netD(fake.detach()), torch.zeros(b, 1, device=device))
            accelerator.backward(err_fake)
            optimizerD.step()
            # generator: make D say 1
            netG.zero_grad()
            errG = criterion(netD(fake), torch.ones(b, 1, device=device))
            accelerator.backward(errG)
            optimizerG.step()
            accelerator.print(f"LOSS iter={it} step={i} d={(err_real + err_fake).item():.6f} g={errG.item():.6f}")


if __name__ == "__main__":
    main()

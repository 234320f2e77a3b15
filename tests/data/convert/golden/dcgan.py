"""The DCGAN recipe, shrunk: two models initialised with weights_init through .apply(), two optimizers, a
fixed noise batch for samples, an --ngpu flag with nn.DataParallel, and a checkpoint per epoch."""
import argparse

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

# one random task on every process: the script draws its data without a seed (see the report)
torch.manual_seed(0)
parser = argparse.ArgumentParser()
parser.add_argument("--nz", type=int, default=4)
parser.add_argument("--ngpu", type=int, default=1)
parser.add_argument("--epochs", type=int, default=2)
opt = parser.parse_args()
accelerator = Accelerator()
device = accelerator.device


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Linear") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self, nz):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(nz, 16), nn.ReLU(True), nn.Linear(16, 2))

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 1))

    def forward(self, x):
        return self.main(x).view(-1)


g = torch.Generator().manual_seed(2)
dataloader = DataLoader(TensorDataset(torch.randn(64, 2, generator=g) * 0.3 + 1.0), batch_size=8, shuffle=True)

netG = Generator(opt.nz)
netG.apply(weights_init)
netD = Discriminator()
netD.apply(weights_init)

criterion = nn.BCEWithLogitsLoss()
fixed_noise = torch.randn(4, opt.nz, device=device)
optimizerD = optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))

netG, netD, optimizerD, optimizerG, dataloader = accelerator.prepare(
    netG, netD, optimizerD, optimizerG, dataloader
)
# each process draws its own random noise tensors; process 0 goes on with the script's own random stream
if accelerator.process_index > 0:
    torch.manual_seed(torch.initial_seed() + accelerator.process_index)
for epoch in range(opt.epochs):
    for i, (real,) in enumerate(dataloader, 0):
        b = real.size(0)
        netD.zero_grad()
        errD_real = criterion(netD(real), torch.full((b,), 1.0, device=device))
        accelerator.backward(errD_real)
        noise = torch.randn(b, opt.nz, device=device)
        fake = netG(noise)
        errD_fake = criterion(netD(fake.detach()), torch.full((b,), 0.0, device=device))
        accelerator.backward(errD_fake)
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(fake), torch.full((b,), 1.0, device=device))
        accelerator.backward(errG)
        optimizerG.step()
        accelerator.print(f"LOSS epoch={epoch} step={i} d={(errD_real + errD_fake).item():.4f} g={errG.item():.4f}")
    with torch.no_grad():
        samples = netG(fixed_noise).detach().cpu()
    accelerator.print("SAMPLES", " ".join(f"{v:.3f}" for v in samples.flatten().tolist()))
    accelerator.wait_for_everyone()
    accelerator.save(accelerator.unwrap_model(netG).state_dict(), f"netG_epoch_{epoch}.pth")
    accelerator.wait_for_everyone()

"""The DCGAN recipe, shrunk: two models initialised with weights_init through .apply(), two optimizers, a
fixed noise batch for samples, an --ngpu flag with nn.DataParallel, and a checkpoint per epoch."""
import argparse

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--nz", type=int, default=4)
parser.add_argument("--ngpu", type=int, default=1)
parser.add_argument("--epochs", type=int, default=2)
opt = parser.parse_args()
device = torch.device("cuda:0" if (torch.cuda.is_available() and opt.ngpu > 0) else "cpu")


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

netG = Generator(opt.nz).to(device)
if (device.type == "cuda") and (opt.ngpu > 1):
    netG = nn.DataParallel(netG, list(range(opt.ngpu)))
netG.apply(weights_init)
netD = Discriminator().to(device)
if (device.type == "cuda") and (opt.ngpu > 1):
    netD = nn.DataParallel(netD, list(range(opt.ngpu)))
netD.apply(weights_init)

criterion = nn.BCEWithLogitsLoss()
fixed_noise = torch.randn(4, opt.nz, device=device)
optimizerD = optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))

for epoch in range(opt.epochs):
    for i, (real,) in enumerate(dataloader, 0):
        real = real.to(device)
        b = real.size(0)
        netD.zero_grad()
        errD_real = criterion(netD(real), torch.full((b,), 1.0, device=device))
        errD_real.backward()
        noise = torch.randn(b, opt.nz, device=device)
        fake = netG(noise)
        errD_fake = criterion(netD(fake.detach()), torch.full((b,), 0.0, device=device))
        errD_fake.backward()
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(fake), torch.full((b,), 1.0, device=device))
        errG.backward()
        optimizerG.step()
        print(f"LOSS epoch={epoch} step={i} d={(errD_real + errD_fake).item():.4f} g={errG.item():.4f}")
    with torch.no_grad():
        samples = netG(fixed_noise).detach().cpu()
    print("SAMPLES", " ".join(f"{v:.3f}" for v in samples.flatten().tolist()))
    torch.save(netG.state_dict(), f"netG_epoch_{epoch}.pth")

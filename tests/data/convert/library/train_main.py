"""Uses trainlib: builds the data and the model, trains, saves."""
import torch
from torch.utils.data import TensorDataset
from trainlib import Trainer, save

torch.manual_seed(0)
g = torch.Generator().manual_seed(5)
dataset = TensorDataset(torch.randn(64, 6, generator=g), torch.randint(0, 2, (64,), generator=g))
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
trained = Trainer(model, dataset).fit(epochs=2)
save(trained, "trained.pt")
print("DONE")

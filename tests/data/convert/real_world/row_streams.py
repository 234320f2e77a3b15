"""An LSTM language model on a token stream laid out as rows (`ids.view(batch_size, -1)` in the project's own data
module, each row a stream), stepped through in time with `ids[:, i:i + n]` and the next-token targets
`ids[:, i + 1:i + 1 + n]`, the states sized by the batch and detached every step, the best weights saved on the
validation loss and loaded back for a last evaluation: the shape of yunjey/pytorch-tutorial's language model."""
import torch
import torch.nn as nn
from stream_corpus import TokenCorpus

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(5)
vocab_size = 30
batch_size = 4
seq_length = 8
num_layers = 1
hidden_size = 24
num_epochs = 2

corpus = TokenCorpus(vocab_size)
ids = corpus.get_data(160, batch_size, seed=1)  # 40 columns: 2 steps a rank on 2 ranks
valid_ids = corpus.get_data(64, batch_size, seed=2)
num_batches = ids.size(1) // seq_length


class RNNLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 12)
        self.lstm = nn.LSTM(12, hidden_size, num_layers, batch_first=True)
        self.linear = nn.Linear(hidden_size, vocab_size)

    def forward(self, x, h):
        out, (h, c) = self.lstm(self.embed(x), h)
        return self.linear(out.reshape(-1, hidden_size)), (h, c)


model = RNNLM().to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)


def detach(states):
    return [state.detach() for state in states]


def validate():
    states = (torch.zeros(num_layers, batch_size, hidden_size).to(device),
              torch.zeros(num_layers, batch_size, hidden_size).to(device))
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, valid_ids.size(1) - seq_length, seq_length):
            outputs, states = model(valid_ids[:, i:i + seq_length].to(device), states)
            total += criterion(outputs, valid_ids[:, i + 1:i + 1 + seq_length].reshape(-1).to(device)).item()
            count += 1
    return total / count


best = float("inf")
for epoch in range(num_epochs):
    states = (torch.zeros(num_layers, batch_size, hidden_size).to(device),
              torch.zeros(num_layers, batch_size, hidden_size).to(device))
    for i in range(0, ids.size(1) - seq_length, seq_length):
        inputs = ids[:, i:i + seq_length].to(device)
        targets = ids[:, (i + 1):(i + 1) + seq_length].to(device)
        states = detach(states)
        outputs, states = model(inputs, states)
        loss = criterion(outputs, targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        step = (i + 1) // seq_length
        print(f"Epoch [{epoch + 1}/{num_epochs}], Step [{step}/{num_batches}], Loss: {loss.item():.4f}")
    val_loss = validate()
    print(f"Epoch [{epoch + 1}/{num_epochs}], validation loss {val_loss:.4f}")
    if val_loss < best:
        best = val_loss
        torch.save(model.state_dict(), "best_rnnlm.ckpt")

model.load_state_dict(torch.load("best_rnnlm.ckpt"))
print(f"best validation loss {validate():.4f}")

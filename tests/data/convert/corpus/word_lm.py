"""The classic word-level language model loop (PyTorch's word_language_model example, shrunk): a token stream cut
into columns by batchify(), windows read with get_batch(source, i) (the targets are the next tokens), the hidden
state carried from window to window, gradient clipping, and a validation pass with the same helpers."""
import argparse
import math

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--bptt", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--lr", type=float, default=0.5)
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
vocab = 11
stream = torch.arange(400) * 7 % vocab  # a corpus with structure to learn
train_tokens, valid_tokens = stream[:320], stream[320:]


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


train_data = batchify(train_tokens, args.batch_size)
val_data = batchify(valid_tokens, 2)


class RNNModel(nn.Module):
    def __init__(self, ntoken, nhid):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, nhid)
        self.rnn = nn.GRU(nhid, nhid)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(output).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return weight.new_zeros(1, bsz, self.nhid)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].reshape(-1)
    return data, target


model = RNNModel(vocab, 16).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)


def evaluate(data_source):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(data_source.size(1))
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train(epoch):
    model.train()
    hidden = model.init_hidden(train_data.size(1))
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        hidden = hidden.detach()
        optimizer.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        print(f"LOSS epoch={epoch} batch={batch} loss={loss.item():.6f}")


for epoch in range(1, args.epochs + 1):
    train(epoch)
    val_loss = evaluate(val_data)
    print(f"EVAL epoch={epoch} valid loss={val_loss:.6f} ppl={math.exp(val_loss):.4f}")

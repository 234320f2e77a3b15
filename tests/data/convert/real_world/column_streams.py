"""A word-level RNN language model on a token stream cut into columns: `batchify` makes a (length, batch) tensor
whose every column is a contiguous stream, `get_batch` takes rows `i:i + bptt` and the next-token targets one row
down, a hidden state from `model.init_hidden(batch)` carried from step to step, a hand-written SGD update unless
`--use-optimizer`, gradient clipping, the learning rate divided by 4 when the validation loss stalls, the best model
pickled whole and loaded back for the test: the shape of pytorch/examples' word_language_model."""
import argparse
import math

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--bptt", type=int, default=8)
parser.add_argument("--lr", type=float, default=5.0)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--use-optimizer", action="store_true")
parser.add_argument("--save", type=str, default="best_lm.pt")
args = parser.parse_args()
torch.manual_seed(7)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

VOCAB = 40
g = torch.Generator().manual_seed(11)
train_tokens = torch.randint(0, VOCAB, (136,), generator=g)  # 34 rows of 4 columns: 2 steps a rank on 2 ranks
valid_tokens = torch.randint(0, VOCAB, (60,), generator=g)
eval_batch_size = 3


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


train_data = batchify(train_tokens, args.batch_size)
val_data = batchify(valid_tokens, eval_batch_size)


class WordRNN(nn.Module):
    def __init__(self, ntoken, ninp, nhid):
        super().__init__()
        self.nhid = nhid
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.GRU(ninp, nhid)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.encoder(x), hidden)
        return torch.log_softmax(self.decoder(output), dim=-1).view(-1, VOCAB), hidden

    def init_hidden(self, bsz):
        return torch.zeros(1, bsz, self.nhid, device=self.decoder.weight.device)


model = WordRNN(VOCAB, 16, 24).to(device)
criterion = nn.NLLLoss()
if args.use_optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr / 100)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def evaluate(data_source):
    model.eval()
    total = 0.0
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            total += len(data) * criterion(output, targets).item()
    return total / (len(data_source) - 1)


def train():
    model.train()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        if args.use_optimizer:
            optimizer.zero_grad()
        else:
            model.zero_grad()
        hidden = hidden.detach()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        if args.use_optimizer:
            optimizer.step()
        else:
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
        print(f"| epoch {epoch} | batch {batch} | loss {loss.item():.4f}")


lr = args.lr
best_val_loss = None
for epoch in range(1, args.epochs + 1):
    train()
    val_loss = evaluate(val_data)
    print(f"| end of epoch {epoch} | valid loss {val_loss:.4f} | valid ppl {math.exp(val_loss):.2f}")
    if not best_val_loss or val_loss < best_val_loss:
        with open(args.save, "wb") as f:
            torch.save(model, f)
        best_val_loss = val_loss
    else:
        lr /= 4.0

with open(args.save, "rb") as f:
    model = torch.load(f, weights_only=False)
test_loss = evaluate(val_data)
print(f"| end of training | test loss {test_loss:.4f} | lr {lr:.4f}")

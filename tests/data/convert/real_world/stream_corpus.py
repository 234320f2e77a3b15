"""The project's own data module: a token stream laid out as `batch_size` rows, each row a contiguous stream."""
import torch


class TokenCorpus:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_data(self, length, batch_size, seed):
        ids = torch.randint(0, self.vocab, (length,), generator=torch.Generator().manual_seed(seed))
        num_batches = ids.size(0) // batch_size
        ids = ids[:num_batches * batch_size]
        return ids.view(batch_size, -1)

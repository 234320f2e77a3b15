"""Fine-tuning with transformers' Trainer: a tiny BERT built from a config, a dataset made in memory."""
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, 16), generator=g)
        self.labels = (self.ids[:, 0] > 50).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main():
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=2)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, num_train_epochs=1, report_to=[])
    trainer = Trainer(model=model, args=args, train_dataset=Pairs())
    trainer.train()
    trainer.save_model("out/final")


if __name__ == "__main__":
    main()

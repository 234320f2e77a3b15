"""Supervised fine-tuning with TRL's SFTTrainer."""
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer

dataset = Dataset.from_dict({"text": ["hello world"] * 32})
model = AutoModelForCausalLM.from_pretrained("./tiny-gpt2")
trainer = SFTTrainer(model=model, args=SFTConfig(output_dir="sft", max_steps=10), train_dataset=dataset)
trainer.train()

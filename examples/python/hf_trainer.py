"""A Hugging Face ``Trainer.train()`` as a Foresight worker: a GPT-2 built from a config (random
weights, nothing downloaded) learns the next byte of the text files in $FORESIGHT_DATASET_PATH,
the corpus `make setup` writes to data/torch-nn/corpus.txt (as examples/python/charlm.py).

    foresight run examples/python/hf_trainer.yaml       # 4 workers, dc-asgd-a

The Trainer keeps its own loop (batching, gradient clipping, logging); the lines marked
`# foresight` make it a worker. The final model's held-out loss is printed in bits per byte.
"""

import math
import os
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import foresight  # foresight
import foresight.torch  # foresight
import foresight.transformers  # foresight

CONTEXT = 64


class Windows(torch.utils.data.Dataset):
    """Every CONTEXT bytes of the corpus is one example; GPT-2 shifts the labels itself."""

    def __init__(self, path):
        files = sorted(p for p in Path(path).rglob("*.txt") if p.is_file())
        if not files:
            raise SystemExit(f"no .txt file under {path}: run `make setup` (it writes data/torch-nn/corpus.txt)")
        data = b"".join(p.read_bytes() for p in files)
        n = len(data) // CONTEXT
        self.tokens = torch.frombuffer(bytearray(data[: n * CONTEXT]), dtype=torch.uint8).long().view(n, CONTEXT)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def evaluate(model, dataset):
    """Mean next-byte cross-entropy in nats, and how often the most likely next byte is right."""
    model.eval()
    loss = right = count = 0.0
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(dataset, batch_size=256):
            ids = batch["input_ids"].to(model.device)  # where the Trainer put the model
            logits = model(input_ids=ids).logits[:, :-1].flatten(0, 1)
            target = ids[:, 1:].flatten()
            loss += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
            right += (logits.argmax(1) == target).sum().item()
            count += target.numel()
    model.train()
    return loss / count, right / count


def main():
    job = foresight.init()  # foresight
    torch.manual_seed(job.seed)  # the same initial weights on every worker
    windows = Windows(os.environ["FORESIGHT_DATASET_PATH"])
    train, test = foresight.split(len(windows))  # foresight: the job's held-out windows
    config = GPT2Config(
        vocab_size=256, n_positions=CONTEXT, n_embd=128, n_layer=2, n_head=4, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None,  # bytes, not GPT-2's tokenizer: no special tokens
    )
    model = GPT2LMHeadModel(config)
    # The parameter server's rule is SGD-like (no Adam): GPT-2's embedding init (std 0.02) sat at
    # the byte-frequency loss for hundreds of steps (examples/python/charlm.py says the same).
    torch.nn.init.normal_(model.transformer.wte.weight, std=1.0)
    opt = foresight.torch.Optimizer(model)  # foresight: replaces the Trainer's AdamW
    held_out = torch.utils.data.Subset(windows, test)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
        num_train_epochs=job.epochs,
        per_device_train_batch_size=job.batch_size,
        max_grad_norm=1.0,
        logging_steps=job.report_every,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        seed=job.seed,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=foresight.transformers.shard(torch.utils.data.Subset(windows, train)),  # foresight
        optimizers=(opt, None),  # foresight
        callbacks=[foresight.transformers.Callback(evaluate=lambda: evaluate(model, held_out))],  # foresight
    )
    trainer.train()  # ends with the parameter server's final model in `model`
    loss, accuracy = evaluate(model, held_out)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"worker {job.worker}: {params} parameters on {model.device}; the final model's held-out loss "
        f"{loss:.3f} nats/byte = {loss / math.log(2):.3f} bits/byte, next byte right {accuracy:.1%}"
    )


if __name__ == "__main__":
    main()

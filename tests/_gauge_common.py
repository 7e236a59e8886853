"""Shared tiny configurations and helpers of the gauge tests (one set of sizes: JAX compiles each
primitive once per shape, so the gauge test files reuse the same ones)."""

from __future__ import annotations

import numpy as np

from _helpers import to_numpy

TINY = dict(n_layers=2, n_heads=2, d_head=2, d_model=5, d_ff=4, vocab=8, n_ctx=4)
VARIANTS = {
    "gpt2-gelu-tied": dict(arch="gpt2", **TINY),
    "gpt2-relu": dict(arch="gpt2", activation="relu", **TINY),
    "gpt2-untied": dict(arch="gpt2", tie_embeddings=False, **TINY),
    "llama": dict(arch="llama", **TINY),
    "llama-tied": dict(arch="llama", tie_embeddings=True, **TINY),
    "bert-gelu": dict(arch="bert", norm_eps=1e-5, **TINY),
    "bert-relu": dict(arch="bert", activation="relu", norm_eps=1e-5, **TINY),
}


def inputs(cfg, xp, device, seed=0):
    """Three random token sequences (and token types for BERT) of the config's context length."""
    rng = np.random.default_rng(seed)
    tok = xp.asarray(rng.integers(0, cfg["vocab"], size=(3, cfg["n_ctx"])), dtype=xp.int64, device=device)
    types = xp.asarray(rng.integers(0, 2, size=(3, cfg["n_ctx"])), dtype=xp.int64, device=device)
    return tok, (types if cfg["arch"] == "bert" else None)


def rel(a, b):
    """max|a − b| / max|b|."""
    a, b = to_numpy(a), to_numpy(b)
    return float(np.abs(a - b).max() / np.abs(b).max())

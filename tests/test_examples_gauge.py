"""``examples/gauge_minilm.py`` runs end to end on a tiny BERT checkpoint made here (no download).

The example needs all-MiniLM-L6-v2's weights for its real run; the smoke run writes a 1-layer,
2-head BERT with the same layout (``geoarray.models.save_checkpoint``) and a character-level WordPiece
vocabulary, runs ``main(["--model-dir", ...])`` on the backend under test, and checks what it prints:
the gauge transformation and the gauge fixing change the embeddings by less than 1e-8 (float64).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import string
from pathlib import Path

import pytest

import geoarray

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gauge_minilm.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("gauge_minilm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gauge_minilm_example_runs_on_a_tiny_checkpoint(backend, tmp_path):
    pytest.importorskip("safetensors", reason="the example reads a safetensors checkpoint (the gauge extra)")
    if backend.kind == "cupy" or backend.name.endswith("cuda"):
        pytest.skip("the example takes a CPU backend name (numpy, torch, jax, array-api-strict)")
    import numpy as np

    from geoarray.models import TransformerLM, save_checkpoint

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *string.ascii_lowercase, *("##" + c for c in string.ascii_lowercase)]
    vocab += list(".,")
    config = {"arch": "bert", "n_layers": 1, "n_heads": 2, "d_head": 4, "d_model": 8, "d_ff": 16}
    config.update(vocab=len(vocab), n_ctx=64)
    model = TransformerLM(config)
    params = model.init(0, xp=np)
    save_checkpoint(tmp_path / "model.safetensors", model, params, dtype="float64")
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")

    example = _load_example()
    # two sentences of one token length (12 here): the example embeds sentence by sentence, and eager JAX
    # compiles every operation once per new length (the four real sentences made this test 60 s on JAX)
    example.SENTENCES = ["A man is here.", "A dog is near."]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        example.main(["--backend", backend.name, "--model-dir", str(tmp_path)])
    text = out.getvalue()
    changes = [float(x) for x in re.findall(r"max \|embedding change\|\s+= (\S+)", text)]
    assert len(changes) == 2, text
    assert max(changes) < 1e-8, text
    assert f"parameters {geoarray.models.TransformerLM(config).n_params():,}" in text

"""geoarray.models.language: GPT-2-, LLaMA- and BERT-style stacks and their Hugging Face layouts.

Every backend, float64. Properties and tolerances:

* outputs equal independent NumPy references written from the Hugging Face state dicts (per-head
  reshapes as in the transformers library, ``x @ W.T`` for torch Linear layouts, scipy's erf) to 1e-12
  relative;
* decoders output log-probabilities (logsumexp over the vocabulary = 0 to 1e-12) and are causal
  (changing token t leaves positions < t unchanged to 1e-14); the encoder is not causal;
* ``erf`` matches math.erf to 4e-15 (a few ulp) on [−8, 8];
* safetensors round trips: geoarray params → HF state dict → file → params are equal (float64 file:
  exactly; float32 file: to float32 rounding) in the GPT-2, BERT and LLaMA layouts, and a bare HF file
  with a ``config.json`` beside it (prefixes, buffers) loads to the same outputs;
* bad configs, tokens and parameters raise ValueError/TypeError naming the key or argument.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import save_file

from _helpers import assert_close, to_numpy
from geoarray.models import TransformerLM, as_config, from_hf_state_dict, load_checkpoint, save_checkpoint
from geoarray.models.language import erf, to_hf_config, to_hf_state_dict

TINY = dict(n_layers=2, n_heads=2, d_head=4, d_model=7, d_ff=9, vocab=11, n_ctx=6)
CONFIGS = {
    "gpt2": dict(arch="gpt2", **TINY),
    "gpt2-relu-untied": dict(arch="gpt2", activation="relu", tie_embeddings=False, **TINY),
    "llama": dict(arch="llama", **TINY),
    "llama-tied": dict(arch="llama", tie_embeddings=True, **TINY),
    "bert": dict(arch="bert", norm_eps=1e-5, **TINY),
}


def _tokens(xp, device, cfg, seed=0, shape=(3, 6)):
    rng = np.random.default_rng(seed)
    tok = xp.asarray(rng.integers(0, cfg["vocab"], size=shape), dtype=xp.int64, device=device)
    types = xp.asarray(rng.integers(0, 2, size=shape), dtype=xp.int64, device=device)
    return tok, (types if cfg["arch"] == "bert" else None)


# --------------------------------------------------------------------------------------------
# NumPy references written from the Hugging Face state dicts
# --------------------------------------------------------------------------------------------


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _split(x, H):
    B, T, n = x.shape
    return x.reshape(B, T, H, n // H).transpose(0, 2, 1, 3)


def _merge(x):
    B, H, T, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * dh)


def _attend(q, k, v, causal):
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if causal:
        T = s.shape[-1]
        s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    return _softmax(s) @ v


def _gelu_new(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _act(name, x):
    from scipy.special import erf as sp_erf

    if name == "gelu_new":
        return _gelu_new(x)
    if name == "gelu":
        return 0.5 * x * (1 + sp_erf(x / math.sqrt(2)))
    return np.maximum(x, 0)


def gpt2_reference(sd, cfg, tokens):
    c = as_config(cfg)
    T = tokens.shape[-1]
    x = sd["wte.weight"][tokens] + sd["wpe.weight"][:T]
    for i in range(c.n_layers):
        h = f"h.{i}."
        a = _ln(x, sd[h + "ln_1.weight"], sd[h + "ln_1.bias"], c.norm_eps)
        qkv = a @ sd[h + "attn.c_attn.weight"] + sd[h + "attn.c_attn.bias"]
        q, k, v = np.split(qkv, 3, axis=-1)
        o = _merge(_attend(_split(q, c.n_heads), _split(k, c.n_heads), _split(v, c.n_heads), True))
        x = x + o @ sd[h + "attn.c_proj.weight"] + sd[h + "attn.c_proj.bias"]
        m = _ln(x, sd[h + "ln_2.weight"], sd[h + "ln_2.bias"], c.norm_eps)
        u = _act(c.activation, m @ sd[h + "mlp.c_fc.weight"] + sd[h + "mlp.c_fc.bias"])
        x = x + u @ sd[h + "mlp.c_proj.weight"] + sd[h + "mlp.c_proj.bias"]
    y = _ln(x, sd["ln_f.weight"], sd["ln_f.bias"], c.norm_eps)
    U = sd["wte.weight"] if c.tie_embeddings else sd["lm_head.weight"]
    return _log_softmax(y @ U.T)


def bert_reference(sd, cfg, tokens, types):
    c = as_config(cfg)
    T = tokens.shape[-1]
    e = "embeddings."
    x = sd[e + "word_embeddings.weight"][tokens] + sd[e + "position_embeddings.weight"][:T]
    x = x + sd[e + "token_type_embeddings.weight"][types]
    x = _ln(x, sd[e + "LayerNorm.weight"], sd[e + "LayerNorm.bias"], c.norm_eps)
    for i in range(c.n_layers):
        h = f"encoder.layer.{i}."

        def lin(name, z, h=h):
            return z @ sd[h + name + ".weight"].T + sd[h + name + ".bias"]

        q, k, v = (_split(lin(f"attention.self.{n}", x), c.n_heads) for n in ("query", "key", "value"))
        o = lin("attention.output.dense", _merge(_attend(q, k, v, False)))
        ln1 = h + "attention.output.LayerNorm."
        x = _ln(x + o, sd[ln1 + "weight"], sd[ln1 + "bias"], c.norm_eps)
        u = lin("output.dense", _act(c.activation, lin("intermediate.dense", x)))
        x = _ln(x + u, sd[h + "output.LayerNorm.weight"], sd[h + "output.LayerNorm.bias"], c.norm_eps)
    return x


def llama_reference(sd, cfg, tokens):
    c = as_config(cfg)
    T = tokens.shape[-1]

    def rms(z, w):
        return z / np.sqrt((z * z).mean(-1, keepdims=True) + c.norm_eps) * w

    inv = 1.0 / c.rope_theta ** (np.arange(0, c.d_head, 2) / c.d_head)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(z):
        half = z.shape[-1] // 2
        return z * cos + np.concatenate([-z[..., half:], z[..., :half]], -1) * sin

    x = sd["model.embed_tokens.weight"][tokens]
    for i in range(c.n_layers):
        h = f"model.layers.{i}."
        a = rms(x, sd[h + "input_layernorm.weight"])
        q, k, v = (_split(a @ sd[h + f"self_attn.{n}_proj.weight"].T, c.n_heads) for n in "qkv")
        x = x + _merge(_attend(rope(q), rope(k), v, True)) @ sd[h + "self_attn.o_proj.weight"].T
        m = rms(x, sd[h + "post_attention_layernorm.weight"])
        g = m @ sd[h + "mlp.gate_proj.weight"].T
        u = (g / (1 + np.exp(-g))) * (m @ sd[h + "mlp.up_proj.weight"].T)
        x = x + u @ sd[h + "mlp.down_proj.weight"].T
    y = rms(x, sd["model.norm.weight"])
    U = sd["model.embed_tokens.weight"] if c.tie_embeddings else sd["lm_head.weight"]
    return _log_softmax(y @ U.T)


def _host_sd(cfg, params):
    return {k: to_numpy(v) for k, v in to_hf_state_dict(cfg, params).items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_hf_reference(name, xp, device):
    cfg = CONFIGS[name]
    model = TransformerLM(cfg)
    params = model.init(0, xp=xp, device=device)
    tok, types = _tokens(xp, device, cfg)
    out = model.apply(params, tok, types)
    sd = _host_sd(cfg, params)
    t = to_numpy(tok)
    if cfg["arch"] == "gpt2":
        ref = gpt2_reference(sd, cfg, t)
    elif cfg["arch"] == "llama":
        ref = llama_reference(sd, cfg, t)
    else:
        ref = bert_reference(sd, cfg, t, to_numpy(types))
    assert tuple(out.shape) == ref.shape
    assert_close(out, ref, xp=xp, device=device, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_outputs_are_causal_log_probabilities(name, xp, device):
    cfg = CONFIGS[name]
    model = TransformerLM(cfg)
    params = model.init(1, xp=xp, device=device)
    tok, _ = _tokens(xp, device, cfg, seed=2)
    out = to_numpy(model.apply(params, tok))
    lse = np.log(np.exp(out).sum(-1))
    assert np.abs(lse).max() <= 1e-12
    t = to_numpy(tok).copy()
    t[:, 4] = (t[:, 4] + 1) % cfg["vocab"]
    out2 = to_numpy(model.apply(params, xp.asarray(t, device=device)))
    assert np.abs(out2[:, :4] - out[:, :4]).max() <= 1e-14
    assert np.abs(out2[:, 4:] - out[:, 4:]).max() > 1e-3


def test_encoder_is_not_causal(xp, device):
    cfg = CONFIGS["bert"]
    model = TransformerLM(cfg)
    params = model.init(1, xp=xp, device=device)
    tok, types = _tokens(xp, device, cfg, seed=2)
    out = to_numpy(model.apply(params, tok, types))
    t = to_numpy(tok).copy()
    t[:, -1] = (t[:, -1] + 1) % cfg["vocab"]
    out2 = to_numpy(model.apply(params, xp.asarray(t, device=device), types))
    assert np.abs(out2[:, 0] - out[:, 0]).max() > 1e-3


def test_erf_matches_math_erf(xp, device):
    x = np.linspace(-8, 8, 2001)
    got = to_numpy(erf(xp.asarray(x, device=device)))
    ref = np.array([math.erf(v) for v in x])
    assert np.abs(got - ref).max() <= 4e-15


@pytest.mark.parametrize("name", ["gpt2", "gpt2-relu-untied", "bert", "llama"])
@pytest.mark.parametrize("file_dtype", ["float64", "float32"])
def test_safetensors_round_trip(name, file_dtype, xp, device, tmp_path):
    cfg = CONFIGS[name]
    model = TransformerLM(cfg)
    params = model.init(3, xp=xp, device=device)
    path = tmp_path / "model.safetensors"
    save_checkpoint(path, model, params, dtype=file_dtype)
    model2, params2 = load_checkpoint(path, xp=xp, device=device)
    assert model2.config == model.config
    assert set(params2) == set(params)
    tol = 0.0 if file_dtype == "float64" else 2e-7
    for k in params:
        ref = to_numpy(params[k])
        assert_close(params2[k], ref.astype(file_dtype).astype(np.float64), xp=xp, device=device, atol=0.0)
        assert np.abs(ref.astype(file_dtype).astype(np.float64) - ref).max() <= tol * max(1.0, np.abs(ref).max())
    if file_dtype == "float64":
        tok, types = _tokens(xp, device, cfg)
        assert_close(model2.apply(params2, tok, types), model.apply(params, tok, types), xp=xp, atol=0.0)


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_bare_hf_checkpoint_with_config_json(name, xp, device, tmp_path):
    """A file as the transformers library writes it: prefixed names, buffers, config.json beside it."""
    cfg = CONFIGS[name]
    model = TransformerLM(cfg)
    params = model.init(4, xp=xp, device=device)
    sd = _host_sd(cfg, params)
    if name == "gpt2":
        sd = {"transformer." + k: v for k, v in sd.items()}
        sd["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 6, 6), dtype=np.float32))  # old mask buffer
    else:
        sd = {"bert." + k: v for k, v in sd.items()}
        sd["bert.embeddings.position_ids"] = np.arange(6, dtype=np.int64)[None]
        sd["bert.pooler.dense.weight"] = np.zeros((7, 7))
        sd["bert.pooler.dense.bias"] = np.zeros(7)
        # older BERT checkpoints name the LayerNorm parameters gamma/beta
        for k in list(sd):
            if k.startswith("bert.embeddings.LayerNorm."):
                sd[k.replace(".weight", ".gamma").replace(".bias", ".beta")] = sd.pop(k)
    save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(to_hf_config(model.config)))
    model2, params2 = load_checkpoint(tmp_path, xp=xp, device=device)
    assert model2.config == model.config
    tok, types = _tokens(xp, device, cfg)
    assert_close(model2.apply(params2, tok, types), model.apply(params, tok, types), xp=xp, atol=0.0)


def test_from_hf_state_dict_names_missing_key(xp, device):
    cfg = CONFIGS["gpt2"]
    model = TransformerLM(cfg)
    sd = to_hf_state_dict(cfg, model.init(0, xp=xp, device=device))
    del sd["h.1.mlp.c_fc.bias"]
    with pytest.raises(ValueError, match=r"h\.1\.mlp\.c_fc\.bias"):
        from_hf_state_dict(cfg, sd)


def test_checkpoint_without_config_is_an_error(tmp_path):
    save_file({"wte.weight": np.zeros((3, 2), dtype=np.float32)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="no configuration"):
        load_checkpoint(tmp_path / "x.safetensors")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"arch": "gpt3"}, "arch"),
        ({"n_heads": 0}, "n_heads"),
        ({"d_head": 2.5}, "d_head"),
        ({"activation": "tanh"}, "activation"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"colour": "red"}, "unknown keys"),
    ],
)
def test_bad_config(change, match):
    with pytest.raises(ValueError, match=match):
        as_config({**CONFIGS["gpt2"], **change})


def test_bad_configs_specific_to_architectures():
    with pytest.raises(ValueError, match="even"):
        as_config({**CONFIGS["llama"], "d_head": 3})
    with pytest.raises(ValueError, match="tie_embeddings"):
        as_config({**CONFIGS["bert"], "tie_embeddings": True})
    with pytest.raises(ValueError, match="missing"):
        as_config({"arch": "gpt2", "n_layers": 1})
    with pytest.raises(TypeError, match="config"):
        as_config(3)


def test_bad_tokens_and_params(xp, device):
    cfg = CONFIGS["gpt2"]
    model = TransformerLM(cfg)
    params = model.init(0, xp=xp, device=device)
    with pytest.raises(TypeError, match="tokens must be an integer array"):
        model.apply(params, xp.zeros((2, 3), device=device))
    with pytest.raises(ValueError, match="n_ctx"):
        model.apply(params, xp.zeros((2, 7), dtype=xp.int64, device=device))
    bad = dict(params)
    bad["layers.0.attn.wq"] = bad["layers.0.attn.wq"][:1, ...]
    with pytest.raises(ValueError, match=r"layers\.0\.attn\.wq"):
        model.check_params(bad)
    bad = dict(params)
    del bad["pos"]
    with pytest.raises(ValueError, match="missing"):
        model.check_params(bad)

"""Reference transformer language models written once against the array API.

Three architectures, chosen by ``config["arch"]``:

``"gpt2"``
    Decoder-only, pre-LayerNorm (Radford et al., "Language Models are Unsupervised Multitask
    Learners"): learned token and position embeddings, per block
    ``x ← x + Attn(LN₁(x))``, ``x ← x + MLP(LN₂(x))`` with LayerNorm
    ``LN(x) = γ ⊙ (x − mean x)/√(var x + ε) + β``, causal multi-head attention with biases,
    MLP ``W_out·σ(W_in·h + b_in) + b_out`` with σ the tanh-GELU (``"gelu_new"``, default) or ReLU
    (``activation="relu"``), a final LayerNorm and, by default, the unembedding tied to the token
    embedding (``logits = LN_f(x) Eᵀ``).
``"llama"``
    Decoder-only, pre-RMSNorm (Touvron et al., "LLaMA: Open and Efficient Foundation Language
    Models"): ``RMS(x) = γ ⊙ x/√(mean x² + ε)``, rotary position embeddings on queries and keys
    (Su et al., "RoFormer"; the rotate-half layout of the Hugging Face implementation), no biases,
    SwiGLU MLP ``W_down·(silu(W_gate·h) ⊙ W_up·h)``, untied unembedding by default.
``"bert"``
    Encoder, post-LayerNorm (Devlin et al., "BERT"): ``x ← LN(E[t] + P[i] + T[type])``, per block
    ``x ← LN₁(x + Attn(x))``, ``x ← LN₂(x + MLP(x))``, no mask, exact (erf) GELU by default. The
    output is the last hidden state (what sentence encoders such as all-MiniLM-L6-v2 pool).

Decoders return log-probabilities of the next token (log-softmax of the logits), the quantity whose
invariance van Nierop ("Transformer models are gauge invariant", section 4.3.1) asks for: "the
predicted probability distribution". Shapes follow the ecosystem: tokens ``(..., T)`` (integers),
outputs ``(..., T, vocab)`` or ``(..., T, d_model)``.

Parameters are a flat dict of arrays with per-head weights stacked along a leading head axis, so that
the gauge group acts by batched matrix products: ``attn.wq``/``wk``/``wv`` ``(H, d_model, d_head)``,
``attn.wo`` ``(H, d_head, d_model)``, ``attn.bq``/``bk``/``bv`` ``(H, d_head)``. Row-vector
convention throughout: ``q = h @ wq + bq``. :func:`from_hf_state_dict` / :func:`to_hf_state_dict`
translate from/to the Hugging Face names of GPT-2 (``h.0.attn.c_attn.weight``, …), BERT
(``encoder.layer.0.attention.self.query.weight``, …) and LLaMA (``model.layers.0.self_attn.q_proj.weight``,
…); :func:`load_checkpoint` / :func:`save_checkpoint` read and write them as safetensors.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .. import random as _random
from .._backend import array_namespace, as_namespace, resolve_dtype

__all__ = [
    "PRESETS",
    "LanguageModelConfig",
    "TransformerLM",
    "as_config",
    "config_from_hf",
    "from_hf_state_dict",
    "load_checkpoint",
    "save_checkpoint",
    "to_hf_state_dict",
]

Array = Any

ARCHS = ("gpt2", "llama", "bert")
_ACTIVATIONS = {"gpt2": ("gelu_new", "gelu", "relu"), "bert": ("gelu", "gelu_new", "relu"), "llama": ("swiglu",)}
_DEFAULT_ACTIVATION = {"gpt2": "gelu_new", "bert": "gelu", "llama": "swiglu"}
_DEFAULT_EPS = {"gpt2": 1e-5, "bert": 1e-12, "llama": 1e-6}
_DEFAULT_TIE = {"gpt2": True, "llama": False, "bert": False}
_INT_KEYS = ("n_layers", "n_heads", "d_head", "d_model", "d_ff", "vocab", "n_ctx")


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LanguageModelConfig:
    """Sizes and options of a :class:`TransformerLM`, built from a plain dict with :func:`as_config`.

    Required: ``arch`` (``"gpt2"``, ``"llama"``, ``"bert"``), ``n_layers``, ``n_heads``, ``d_head``,
    ``d_model``, ``d_ff``, ``vocab``, ``n_ctx``. Optional: ``activation`` (gpt2: ``"gelu_new"``,
    ``"gelu"``, ``"relu"``; bert: ``"gelu"``, ``"gelu_new"``, ``"relu"``; llama: ``"swiglu"``),
    ``norm_eps`` (ε of the norms; gpt2 1e-5, llama 1e-6, bert 1e-12 by default; must be > 0),
    ``tie_embeddings`` (decoders; gpt2 True, llama False by default), ``rope_theta`` (llama, 10000),
    ``n_types`` (bert's token-type vocabulary, 2). ``n_heads·d_head`` need not equal ``d_model``.
    """

    arch: str
    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    d_ff: int
    vocab: int
    n_ctx: int
    activation: str | None = None
    norm_eps: float | None = None
    tie_embeddings: bool | None = None
    rope_theta: float = 10000.0
    n_types: int = 2

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"config['arch'] must be one of {ARCHS}, got {self.arch!r}")
        for key in _INT_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config[{key!r}] must be a positive int, got {value!r}")
        activation = _DEFAULT_ACTIVATION[self.arch] if self.activation is None else self.activation
        if activation not in _ACTIVATIONS[self.arch]:
            raise ValueError(
                f"config['activation'] for arch {self.arch!r} must be one of {_ACTIVATIONS[self.arch]}, "
                f"got {activation!r}"
            )
        object.__setattr__(self, "activation", activation)
        eps = _DEFAULT_EPS[self.arch] if self.norm_eps is None else self.norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps > 0):
            raise ValueError(
                "config['norm_eps'] must be a positive finite number (with ε = 0 the scale of the residual "
                f"stream becomes one more symmetry than geoarray.gauge counts), got {eps!r}"
            )
        object.__setattr__(self, "norm_eps", float(eps))
        tie = _DEFAULT_TIE[self.arch] if self.tie_embeddings is None else self.tie_embeddings
        if not isinstance(tie, bool):
            raise ValueError(f"config['tie_embeddings'] must be a bool, got {tie!r}")
        if self.arch == "bert" and tie:
            raise ValueError("config['tie_embeddings'] must be False for arch 'bert' (an encoder has no unembedding)")
        object.__setattr__(self, "tie_embeddings", tie)
        if self.arch == "llama" and self.d_head % 2:
            raise ValueError(f"config['d_head'] must be even for rotary embeddings (arch 'llama'), got {self.d_head}")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 1):
            raise ValueError(f"config['rope_theta'] must be a number > 1, got {self.rope_theta!r}")
        if isinstance(self.n_types, bool) or not isinstance(self.n_types, int) or self.n_types < 1:
            raise ValueError(f"config['n_types'] must be a positive int, got {self.n_types!r}")

    @property
    def decoder(self) -> bool:
        return self.arch in ("gpt2", "llama")

    @property
    def norm(self) -> str:
        """``"layernorm"`` (centre and scale, γ and β) or ``"rmsnorm"`` (scale only, γ)."""
        return "rmsnorm" if self.arch == "llama" else "layernorm"

    @property
    def biases(self) -> bool:
        return self.arch != "llama"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> LanguageModelConfig:
        return as_config({**self.to_dict(), **changes})


_FIELDS = {f.name for f in fields(LanguageModelConfig)}

PRESETS: dict[str, dict[str, Any]] = {
    # the configurations of van Nierop's Table 1 (Hugging Face gpt2, gpt2-xl; LLaMA-65B of Touvron et al.)
    "gpt2": dict(arch="gpt2", n_layers=12, n_heads=12, d_head=64, d_model=768, d_ff=3072, vocab=50257, n_ctx=1024),
    "gpt2-xl": dict(arch="gpt2", n_layers=48, n_heads=25, d_head=64, d_model=1600, d_ff=6400, vocab=50257, n_ctx=1024),
    "llama-65b": dict(
        arch="llama", n_layers=80, n_heads=64, d_head=128, d_model=8192, d_ff=22016, vocab=32000, n_ctx=2048
    ),
    "all-minilm-l6-v2": dict(
        arch="bert", n_layers=6, n_heads=12, d_head=32, d_model=384, d_ff=1536, vocab=30522, n_ctx=512
    ),
}


def as_config(config: Any) -> LanguageModelConfig:
    """A :class:`LanguageModelConfig` from a config, a plain dict, or the name of a :data:`PRESETS` entry."""
    if isinstance(config, LanguageModelConfig):
        return config
    if isinstance(config, str):
        if config not in PRESETS:
            raise ValueError(f"config name must be one of {sorted(PRESETS)}, got {config!r}")
        return LanguageModelConfig(**PRESETS[config])
    if isinstance(config, TransformerLM):
        return config.config
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, a LanguageModelConfig or a preset name, got {type(config).__name__}")
    unknown = sorted(set(config) - _FIELDS)
    if unknown:
        raise ValueError(f"config has unknown keys {unknown}; known keys: {sorted(_FIELDS)}")
    missing = [k for k in ("arch", *_INT_KEYS) if k not in config]
    if missing:
        raise ValueError(f"config is missing the keys {missing}")
    return LanguageModelConfig(**dict(config))


# ---------------------------------------------------------------------------------------------
# elementwise functions (the array API has no erf; GELU variants, SiLU)
# ---------------------------------------------------------------------------------------------

_GELU_C = math.sqrt(2 / math.pi)
_ERF_TERMS = 110  # enough for |x| ≤ 6 to float64 accuracy (next term < 1e-18 of the sum)


def erf(x: Array) -> Array:
    """The error function to float64 accuracy, from standard array-API operations only.

    erf(x) = (2/√π) x e^{−x²} Σ_{n≥0} (2x²)ⁿ / (1·3·…·(2n+1)) (Abramowitz & Stegun 7.1.6): every term
    is positive, so the sum has no cancellation; |x| is clipped at 6, where erf = 1 to float64
    precision (1 − erf(6) = 2·10⁻¹⁷), and 110 terms then reach relative accuracy 1e-18.
    """
    xp = array_namespace(x)
    z = xp.clip(x, -6.0, 6.0)
    z2 = 2 * z * z
    term = xp.ones_like(z)
    total = xp.ones_like(z)
    for n in range(1, _ERF_TERMS):
        term = term * z2 / (2 * n + 1)
        total = total + term
    return (2 / math.sqrt(math.pi)) * z * xp.exp(-z * z) * total


def _activation(name: str, x: Array) -> Array:
    xp = array_namespace(x)
    if name == "gelu_new":
        return x * (1 + xp.tanh(_GELU_C * (x + 0.044715 * x**3))) / 2
    if name == "gelu":
        return x * (1 + erf(x / math.sqrt(2))) / 2
    if name == "relu":
        return xp.where(x > 0, x, xp.zeros_like(x))
    raise ValueError(f"unknown activation {name!r}")


def _silu(x: Array) -> Array:
    xp = array_namespace(x)
    return x * (1 + xp.tanh(x / 2)) / 2  # x·sigmoid(x) without overflow for large |x|


def _log_softmax(z: Array) -> Array:
    xp = array_namespace(z)
    z = z - xp.max(z, axis=-1, keepdims=True)
    return z - xp.log(xp.sum(xp.exp(z), axis=-1, keepdims=True))


def layer_norm(x: Array, scale: Array | None, shift: Array | None, eps: float) -> Array:
    """γ ⊙ (x − mean x)/√(var x + ε) + β over the last axis (``scale``/``shift`` may be None)."""
    xp = array_namespace(x)
    xc = x - xp.mean(x, axis=-1, keepdims=True)
    n = xc / xp.sqrt(xp.mean(xc * xc, axis=-1, keepdims=True) + eps)
    if scale is not None:
        n = n * scale
    if shift is not None:
        n = n + shift
    return n


def rms_norm(x: Array, scale: Array | None, eps: float) -> Array:
    """γ ⊙ x/√(mean x² + ε) over the last axis."""
    xp = array_namespace(x)
    n = x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)
    return n if scale is None else n * scale


def rope_tables(T: int, d_head: int, theta: float, *, xp: Any, dtype: Any, device: Any) -> tuple[Array, Array]:
    """cos and sin of the rotary angles t·θ^{−2k/d_head}, each ``(T, d_head)`` in the rotate-half layout."""
    half = d_head // 2
    k = xp.arange(half, dtype=dtype, device=device)
    inv_freq = xp.exp(-(2 * k / d_head) * math.log(theta))
    t = xp.arange(T, dtype=dtype, device=device)
    ang = t[:, None] * inv_freq[None, :]
    ang = xp.concat([ang, ang], axis=-1)
    return xp.cos(ang), xp.sin(ang)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate feature pairs (k, k + d_head/2) of ``x`` (..., T, d_head) by the angles of ``cos``/``sin``."""
    xp = array_namespace(x)
    half = x.shape[-1] // 2
    rotated = xp.concat([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------


def _layer_keys(config: LanguageModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    c = config
    H, d, dh, f = c.n_heads, c.d_model, c.d_head, c.d_ff
    p = f"layers.{layer}."
    shapes: dict[str, tuple[int, ...]] = {}

    def norm(name: str) -> None:
        shapes[p + name + ".scale"] = (d,)
        if c.norm == "layernorm":
            shapes[p + name + ".shift"] = (d,)

    if c.arch != "bert":
        norm("norm1")
    for w in ("wq", "wk", "wv"):
        shapes[p + "attn." + w] = (H, d, dh)
        if c.biases:
            shapes[p + "attn.b" + w[1]] = (H, dh)
    shapes[p + "attn.wo"] = (H, dh, d)
    if c.biases:
        shapes[p + "attn.bo"] = (d,)
    if c.arch == "bert":
        norm("norm1")
    else:
        norm("norm2")
    if c.activation == "swiglu":
        shapes[p + "mlp.w_gate"] = (d, f)
    shapes[p + "mlp.w_in"] = (d, f)
    if c.biases:
        shapes[p + "mlp.b_in"] = (f,)
    shapes[p + "mlp.w_out"] = (f, d)
    if c.biases:
        shapes[p + "mlp.b_out"] = (d,)
    if c.arch == "bert":
        norm("norm2")
    return shapes


def param_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Name → shape of every parameter of the configured model (no arrays are made)."""
    c = as_config(config)
    d = c.d_model
    shapes: dict[str, tuple[int, ...]] = {"embed": (c.vocab, d)}
    if c.arch in ("gpt2", "bert"):
        shapes["pos"] = (c.n_ctx, d)
    if c.arch == "bert":
        shapes["type"] = (c.n_types, d)
        shapes["emb_norm.scale"] = (d,)
        shapes["emb_norm.shift"] = (d,)
    for layer in range(c.n_layers):
        shapes.update(_layer_keys(c, layer))
    if c.decoder:
        shapes["final_norm.scale"] = (d,)
        if c.norm == "layernorm":
            shapes["final_norm.shift"] = (d,)
        if not c.tie_embeddings:
            shapes["unembed"] = (d, c.vocab)
    return shapes


def count_params(config: Any) -> int:
    """Number of scalar parameters of the configured model."""
    return sum(math.prod(s) for s in param_shapes(config).values())


class TransformerLM:
    """A GPT-2-, LLaMA- or BERT-style transformer stack (see the module docstring), array-API throughout.

    ``model = TransformerLM({"arch": "gpt2", "n_layers": 2, ...})``;
    ``params = model.init(seed, xp=np)``; ``out = model.apply(params, tokens)``.
    """

    def __init__(self, config: Any):
        self.config = as_config(config)

    def __repr__(self) -> str:
        return f"TransformerLM({self.config.to_dict()!r})"

    # -- parameters -------------------------------------------------------------------------

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return param_shapes(self.config)

    def n_params(self) -> int:
        return count_params(self.config)

    def init(self, seed: Any = 0, *, xp: Any, dtype: Any = None, device: Any = None) -> dict[str, Array]:
        """Random generic parameters: Gaussian weights with variance 1/fan-in, norm scales 1 + 0.2·N(0,1),
        biases and shifts 0.1·N(0,1), embeddings N(0,1).

        Generic (no scale exactly 1, no bias exactly 0) on purpose: symmetry counts and invariance
        checks are statements about generic points. This is a test model, not a training recipe.
        """
        xp = as_namespace(xp)
        dtype = resolve_dtype(xp, dtype, device)
        shapes = self.param_shapes()
        seeds = _random.spawn(seed, len(shapes))
        params = {}
        for s, (name, shape) in zip(seeds, shapes.items(), strict=True):
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "scale":
                value = _random.normal(s, shape, xp=xp, dtype=dtype, device=device, loc=1.0, scale=0.2)
            elif leaf in ("shift", "bq", "bk", "bv", "bo", "b_in", "b_out"):
                value = _random.normal(s, shape, xp=xp, dtype=dtype, device=device, scale=0.1)
            elif name in ("embed", "pos", "type"):
                value = _random.normal(s, shape, xp=xp, dtype=dtype, device=device)
            else:
                fan_in = shape[-2]
                value = _random.normal(s, shape, xp=xp, dtype=dtype, device=device, scale=1 / math.sqrt(fan_in))
            params[name] = value
        return params

    def check_params(self, params: Mapping[str, Array]) -> None:
        """ValueError naming the parameter when a key is missing or unknown or a shape is wrong."""
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
        shapes = self.param_shapes()
        missing = [k for k in shapes if k not in params]
        extra = [k for k in params if k not in shapes]
        if missing or extra:
            raise ValueError(
                f"params do not match the {self.config.arch} config: missing {missing[:5]}"
                f"{'…' if len(missing) > 5 else ''}, unexpected {extra[:5]}{'…' if len(extra) > 5 else ''}"
            )
        for k, shape in shapes.items():
            if tuple(params[k].shape) != shape:
                raise ValueError(f"params[{k!r}] must have shape {shape}, got {tuple(params[k].shape)}")

    # -- forward ----------------------------------------------------------------------------

    def _check_tokens(self, tokens: Array, name: str = "tokens") -> Any:
        xp = array_namespace(tokens)
        if not xp.isdtype(tokens.dtype, "integral"):
            raise TypeError(f"{name} must be an integer array, got dtype {tokens.dtype}")
        if tokens.ndim < 1:
            raise ValueError(f"{name} must have shape (..., T), got a scalar")
        T = tokens.shape[-1]
        if not 1 <= T <= self.config.n_ctx:
            raise ValueError(f"{name} must have 1 ≤ T ≤ n_ctx = {self.config.n_ctx} positions, got T = {T}")
        return xp

    def _embed(self, table: Array, tokens: Array) -> Array:
        xp = array_namespace(table)
        flat = xp.reshape(tokens, (-1,))
        out = xp.take(table, flat, axis=0)
        return xp.reshape(out, (*tokens.shape, table.shape[-1]))

    def _norm(self, params: Mapping[str, Array], name: str, x: Array) -> Array:
        c = self.config
        if c.norm == "rmsnorm":
            return rms_norm(x, params[name + ".scale"], c.norm_eps)
        return layer_norm(x, params[name + ".scale"], params[name + ".shift"], c.norm_eps)

    def _attention(self, params: Mapping[str, Array], p: str, h: Array) -> Array:
        c = self.config
        xp = array_namespace(h)
        T = h.shape[-2]
        hx = h[..., None, :, :]  # (..., 1, T, d): broadcasts against the head axis of the weights
        q = hx @ params[p + "attn.wq"]
        k = hx @ params[p + "attn.wk"]
        v = hx @ params[p + "attn.wv"]
        if c.biases:
            q = q + params[p + "attn.bq"][:, None, :]
            k = k + params[p + "attn.bk"][:, None, :]
            v = v + params[p + "attn.bv"][:, None, :]
        if c.arch == "llama":
            cos, sin = rope_tables(T, c.d_head, c.rope_theta, xp=xp, dtype=h.dtype, device=_device(h))
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        scores = (q @ xp.matrix_transpose(k)) / math.sqrt(c.d_head)
        if c.decoder:
            i = xp.arange(T, device=_device(h))
            causal = i[:, None] >= i[None, :]
            scores = xp.where(causal, scores, xp.asarray(-xp.inf, dtype=scores.dtype, device=_device(h)))
        scores = scores - xp.max(scores, axis=-1, keepdims=True)
        e = xp.exp(scores)
        attn = e / xp.sum(e, axis=-1, keepdims=True)
        out = xp.sum((attn @ v) @ params[p + "attn.wo"], axis=-3)
        if c.biases:
            out = out + params[p + "attn.bo"]
        return out

    def _mlp(self, params: Mapping[str, Array], p: str, h: Array) -> Array:
        c = self.config
        if c.activation == "swiglu":
            u = _silu(h @ params[p + "mlp.w_gate"]) * (h @ params[p + "mlp.w_in"])
            return u @ params[p + "mlp.w_out"]
        u = h @ params[p + "mlp.w_in"] + params[p + "mlp.b_in"]
        return _activation(c.activation, u) @ params[p + "mlp.w_out"] + params[p + "mlp.b_out"]

    def hidden_states(self, params: Mapping[str, Array], tokens: Array, token_types: Array | None = None) -> Array:
        """The residual stream after the last block, ``(..., T, d_model)`` (for bert: the model output;
        for decoders: before the final norm)."""
        c = self.config
        self._check_tokens(tokens)
        xp = array_namespace(params["embed"])
        T = tokens.shape[-1]
        x = self._embed(params["embed"], tokens)
        if c.arch in ("gpt2", "bert"):
            x = x + params["pos"][:T, :]
        if c.arch == "bert":
            if token_types is None:
                types = xp.zeros(tokens.shape, dtype=tokens.dtype, device=_device(tokens))
            else:
                self._check_tokens(token_types, "token_types")
                if tuple(token_types.shape) != tuple(tokens.shape):
                    raise ValueError(
                        f"token_types must have the shape of tokens {tuple(tokens.shape)}, "
                        f"got {tuple(token_types.shape)}"
                    )
                types = token_types
            x = layer_norm(
                x + self._embed(params["type"], types), params["emb_norm.scale"], params["emb_norm.shift"], c.norm_eps
            )
        elif token_types is not None:
            raise ValueError(f"token_types is only used by arch 'bert', got it for arch {c.arch!r}")
        for layer in range(c.n_layers):
            p = f"layers.{layer}."
            if c.arch == "bert":
                x = self._norm(params, p + "norm1", x + self._attention(params, p, x))
                x = self._norm(params, p + "norm2", x + self._mlp(params, p, x))
            else:
                x = x + self._attention(params, p, self._norm(params, p + "norm1", x))
                x = x + self._mlp(params, p, self._norm(params, p + "norm2", x))
        return x

    def logits(self, params: Mapping[str, Array], tokens: Array) -> Array:
        """Next-token logits ``(..., T, vocab)`` of a decoder."""
        c = self.config
        if not c.decoder:
            raise ValueError("logits: arch 'bert' is an encoder without an unembedding; use apply (hidden states)")
        xp = array_namespace(params["embed"])
        y = self._norm(params, "final_norm", self.hidden_states(params, tokens))
        if c.tie_embeddings:
            return y @ xp.matrix_transpose(params["embed"])
        return y @ params["unembed"]

    def apply(self, params: Mapping[str, Array], tokens: Array, token_types: Array | None = None) -> Array:
        """The model's output: log-probabilities ``(..., T, vocab)`` (decoders) or hidden states (bert)."""
        if self.config.decoder:
            if token_types is not None:
                raise ValueError(f"token_types is only used by arch 'bert', got it for arch {self.config.arch!r}")
            return _log_softmax(self.logits(params, tokens))
        return self.hidden_states(params, tokens, token_types)

    __call__ = apply


def _device(x: Array) -> Any:
    from .._backend import device

    return device(x)


# ---------------------------------------------------------------------------------------------
# Hugging Face layouts and safetensors
# ---------------------------------------------------------------------------------------------


def config_from_hf(hf: Mapping[str, Any]) -> LanguageModelConfig:
    """A config from a Hugging Face ``config.json`` dict (model_type gpt2, bert or llama)."""
    kind = hf.get("model_type")
    if kind == "gpt2":
        d, H = hf["n_embd"], hf["n_head"]
        act = hf.get("activation_function", "gelu_new")
        return as_config(
            dict(
                arch="gpt2",
                n_layers=hf["n_layer"],
                n_heads=H,
                d_head=hf.get("head_dim") or d // H,
                d_model=d,
                d_ff=hf.get("n_inner") or 4 * d,
                vocab=hf["vocab_size"],
                n_ctx=hf.get("n_positions", hf.get("n_ctx", 1024)),
                activation={"gelu_pytorch_tanh": "gelu_new"}.get(act, act),
                norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                tie_embeddings=hf.get("tie_word_embeddings", True),
            )
        )
    if kind == "bert":
        d, H = hf["hidden_size"], hf["num_attention_heads"]
        act = hf.get("hidden_act", "gelu")
        return as_config(
            dict(
                arch="bert",
                n_layers=hf["num_hidden_layers"],
                n_heads=H,
                d_head=hf.get("head_dim") or d // H,
                d_model=d,
                d_ff=hf["intermediate_size"],
                vocab=hf["vocab_size"],
                n_ctx=hf.get("max_position_embeddings", 512),
                activation={"gelu_new": "gelu_new", "relu": "relu"}.get(act, "gelu"),
                norm_eps=hf.get("layer_norm_eps", 1e-12),
                n_types=hf.get("type_vocab_size", 2),
            )
        )
    if kind == "llama":
        d, H = hf["hidden_size"], hf["num_attention_heads"]
        if hf.get("num_key_value_heads", H) != H:
            raise ValueError("grouped-query attention (num_key_value_heads < num_attention_heads) is not supported")
        return as_config(
            dict(
                arch="llama",
                n_layers=hf["num_hidden_layers"],
                n_heads=H,
                d_head=hf.get("head_dim") or d // H,
                d_model=d,
                d_ff=hf["intermediate_size"],
                vocab=hf["vocab_size"],
                n_ctx=hf.get("max_position_embeddings", 2048),
                norm_eps=hf.get("rms_norm_eps", 1e-6),
                rope_theta=float(hf.get("rope_theta", 10000.0)),
                tie_embeddings=hf.get("tie_word_embeddings", False),
            )
        )
    raise ValueError(f"config.json: model_type must be 'gpt2', 'bert' or 'llama', got {kind!r}")


def _hf_config(config: LanguageModelConfig) -> dict[str, Any]:
    c = config
    if c.arch == "gpt2":
        return {
            "model_type": "gpt2",
            "n_layer": c.n_layers,
            "n_head": c.n_heads,
            "n_embd": c.d_model,
            "head_dim": c.d_head,  # not a transformers key: GPT-2 there has d_head = n_embd / n_head
            "n_inner": c.d_ff,
            "vocab_size": c.vocab,
            "n_positions": c.n_ctx,
            "activation_function": c.activation,
            "layer_norm_epsilon": c.norm_eps,
            "tie_word_embeddings": c.tie_embeddings,
        }
    if c.arch == "bert":
        return {
            "model_type": "bert",
            "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads,
            "head_dim": c.d_head,  # not a transformers key: BERT there has head size = hidden / heads
            "hidden_size": c.d_model,
            "intermediate_size": c.d_ff,
            "vocab_size": c.vocab,
            "max_position_embeddings": c.n_ctx,
            "hidden_act": c.activation,
            "layer_norm_eps": c.norm_eps,
            "type_vocab_size": c.n_types,
        }
    return {
        "model_type": "llama",
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_heads,
        "head_dim": c.d_head,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "vocab_size": c.vocab,
        "max_position_embeddings": c.n_ctx,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tie_embeddings,
    }


def _strip(sd: Mapping[str, Any], prefixes: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for k, v in sd.items():
        for pre in prefixes:
            if k.startswith(pre):
                k = k[len(pre) :]
                break
        out[k] = v
    return out


def _heads_in(w: Array, H: int, dh: int, xp: Any) -> Array:
    """(d, H·dh) → (H, d, dh)."""
    return xp.permute_dims(xp.reshape(w, (w.shape[0], H, dh)), (1, 0, 2))


def _heads_out(w: Array, xp: Any) -> Array:
    """(H, d, dh) → (d, H·dh)."""
    H, d, dh = w.shape
    return xp.reshape(xp.permute_dims(w, (1, 0, 2)), (d, H * dh))


def _norm_key(sd: Mapping[str, Any], base: str, new: str, old: str) -> Any:
    if base + new in sd:
        return sd[base + new]
    if base + old in sd:
        return sd[base + old]
    raise KeyError(base + new)


def from_hf_state_dict(config: Any, state_dict: Mapping[str, Array]) -> dict[str, Array]:
    """geoarray parameters from a Hugging Face state dict (GPT-2, BERT or LLaMA names).

    The arrays keep the namespace they come in (e.g. NumPy from ``safetensors.numpy``). Prefixes
    ``transformer.``, ``bert.``, ``model.`` are accepted; buffers (``attn.bias`` masks,
    ``position_ids``) and heads this model does not have (``pooler.*``, ``cls.*``) are ignored.
    """
    c = as_config(config)
    H, dh = c.n_heads, c.d_head
    sd = dict(state_dict)
    first = next(iter(sd.values()))
    xp = array_namespace(first)
    T = xp.matrix_transpose
    P: dict[str, Array] = {}
    try:
        if c.arch == "gpt2":
            sd = _strip(sd, ("transformer.",))
            P["embed"] = sd["wte.weight"]
            P["pos"] = sd["wpe.weight"]
            for i in range(c.n_layers):
                h, p = f"h.{i}.", f"layers.{i}."
                w = sd[h + "attn.c_attn.weight"]
                b = sd[h + "attn.c_attn.bias"]
                n = H * dh
                for j, name in enumerate("qkv"):
                    P[p + f"attn.w{name}"] = _heads_in(w[:, j * n : (j + 1) * n], H, dh, xp)
                    P[p + f"attn.b{name}"] = xp.reshape(b[j * n : (j + 1) * n], (H, dh))
                P[p + "attn.wo"] = xp.reshape(sd[h + "attn.c_proj.weight"], (H, dh, c.d_model))
                P[p + "attn.bo"] = sd[h + "attn.c_proj.bias"]
                for k, hk in (("norm1", "ln_1"), ("norm2", "ln_2")):
                    P[p + k + ".scale"] = sd[h + hk + ".weight"]
                    P[p + k + ".shift"] = sd[h + hk + ".bias"]
                P[p + "mlp.w_in"] = sd[h + "mlp.c_fc.weight"]
                P[p + "mlp.b_in"] = sd[h + "mlp.c_fc.bias"]
                P[p + "mlp.w_out"] = sd[h + "mlp.c_proj.weight"]
                P[p + "mlp.b_out"] = sd[h + "mlp.c_proj.bias"]
            P["final_norm.scale"] = sd["ln_f.weight"]
            P["final_norm.shift"] = sd["ln_f.bias"]
            if not c.tie_embeddings:
                P["unembed"] = T(sd["lm_head.weight"])
        elif c.arch == "bert":
            sd = _strip(sd, ("bert.",))
            e = "embeddings."
            P["embed"] = sd[e + "word_embeddings.weight"]
            P["pos"] = sd[e + "position_embeddings.weight"]
            P["type"] = sd[e + "token_type_embeddings.weight"]
            P["emb_norm.scale"] = _norm_key(sd, e + "LayerNorm.", "weight", "gamma")
            P["emb_norm.shift"] = _norm_key(sd, e + "LayerNorm.", "bias", "beta")
            for i in range(c.n_layers):
                h, p = f"encoder.layer.{i}.", f"layers.{i}."
                for name, hk in (("q", "query"), ("k", "key"), ("v", "value")):
                    P[p + f"attn.w{name}"] = _heads_in(T(sd[h + f"attention.self.{hk}.weight"]), H, dh, xp)
                    P[p + f"attn.b{name}"] = xp.reshape(sd[h + f"attention.self.{hk}.bias"], (H, dh))
                P[p + "attn.wo"] = xp.reshape(T(sd[h + "attention.output.dense.weight"]), (H, dh, c.d_model))
                P[p + "attn.bo"] = sd[h + "attention.output.dense.bias"]
                P[p + "norm1.scale"] = _norm_key(sd, h + "attention.output.LayerNorm.", "weight", "gamma")
                P[p + "norm1.shift"] = _norm_key(sd, h + "attention.output.LayerNorm.", "bias", "beta")
                P[p + "mlp.w_in"] = T(sd[h + "intermediate.dense.weight"])
                P[p + "mlp.b_in"] = sd[h + "intermediate.dense.bias"]
                P[p + "mlp.w_out"] = T(sd[h + "output.dense.weight"])
                P[p + "mlp.b_out"] = sd[h + "output.dense.bias"]
                P[p + "norm2.scale"] = _norm_key(sd, h + "output.LayerNorm.", "weight", "gamma")
                P[p + "norm2.shift"] = _norm_key(sd, h + "output.LayerNorm.", "bias", "beta")
        else:
            lm_head = sd.get("lm_head.weight")
            sd = _strip(sd, ("model.",))
            P["embed"] = sd["embed_tokens.weight"]
            for i in range(c.n_layers):
                h, p = f"layers.{i}.", f"layers.{i}."
                for name in "qkv":
                    P[p + f"attn.w{name}"] = _heads_in(T(sd[h + f"self_attn.{name}_proj.weight"]), H, dh, xp)
                P[p + "attn.wo"] = xp.reshape(T(sd[h + "self_attn.o_proj.weight"]), (H, dh, c.d_model))
                P[p + "norm1.scale"] = sd[h + "input_layernorm.weight"]
                P[p + "norm2.scale"] = sd[h + "post_attention_layernorm.weight"]
                P[p + "mlp.w_gate"] = T(sd[h + "mlp.gate_proj.weight"])
                P[p + "mlp.w_in"] = T(sd[h + "mlp.up_proj.weight"])
                P[p + "mlp.w_out"] = T(sd[h + "mlp.down_proj.weight"])
            P["final_norm.scale"] = sd["norm.weight"]
            if not c.tie_embeddings:
                if lm_head is None:
                    raise KeyError("lm_head.weight")
                P["unembed"] = T(lm_head)
    except KeyError as exc:
        raise ValueError(
            f"state dict is not a Hugging Face {c.arch} layout matching the config: missing {exc.args[0]!r}"
        ) from None
    TransformerLM(c).check_params(P)
    return P


def to_hf_state_dict(config: Any, params: Mapping[str, Array]) -> dict[str, Array]:
    """The Hugging Face state dict (GPT-2, BERT or LLaMA names, unprefixed) of geoarray parameters."""
    c = as_config(config)
    TransformerLM(c).check_params(params)
    xp = array_namespace(params["embed"])
    T = xp.matrix_transpose
    P = params
    sd: dict[str, Array] = {}
    if c.arch == "gpt2":
        sd["wte.weight"] = P["embed"]
        sd["wpe.weight"] = P["pos"]
        for i in range(c.n_layers):
            h, p = f"h.{i}.", f"layers.{i}."
            sd[h + "ln_1.weight"] = P[p + "norm1.scale"]
            sd[h + "ln_1.bias"] = P[p + "norm1.shift"]
            sd[h + "attn.c_attn.weight"] = xp.concat([_heads_out(P[p + f"attn.w{n}"], xp) for n in "qkv"], axis=1)
            sd[h + "attn.c_attn.bias"] = xp.concat([xp.reshape(P[p + f"attn.b{n}"], (-1,)) for n in "qkv"])
            sd[h + "attn.c_proj.weight"] = xp.reshape(P[p + "attn.wo"], (-1, c.d_model))
            sd[h + "attn.c_proj.bias"] = P[p + "attn.bo"]
            sd[h + "ln_2.weight"] = P[p + "norm2.scale"]
            sd[h + "ln_2.bias"] = P[p + "norm2.shift"]
            sd[h + "mlp.c_fc.weight"] = P[p + "mlp.w_in"]
            sd[h + "mlp.c_fc.bias"] = P[p + "mlp.b_in"]
            sd[h + "mlp.c_proj.weight"] = P[p + "mlp.w_out"]
            sd[h + "mlp.c_proj.bias"] = P[p + "mlp.b_out"]
        sd["ln_f.weight"] = P["final_norm.scale"]
        sd["ln_f.bias"] = P["final_norm.shift"]
        if not c.tie_embeddings:
            sd["lm_head.weight"] = T(P["unembed"])
    elif c.arch == "bert":
        e = "embeddings."
        sd[e + "word_embeddings.weight"] = P["embed"]
        sd[e + "position_embeddings.weight"] = P["pos"]
        sd[e + "token_type_embeddings.weight"] = P["type"]
        sd[e + "LayerNorm.weight"] = P["emb_norm.scale"]
        sd[e + "LayerNorm.bias"] = P["emb_norm.shift"]
        for i in range(c.n_layers):
            h, p = f"encoder.layer.{i}.", f"layers.{i}."
            for n, hk in (("q", "query"), ("k", "key"), ("v", "value")):
                sd[h + f"attention.self.{hk}.weight"] = T(_heads_out(P[p + f"attn.w{n}"], xp))
                sd[h + f"attention.self.{hk}.bias"] = xp.reshape(P[p + f"attn.b{n}"], (-1,))
            sd[h + "attention.output.dense.weight"] = T(xp.reshape(P[p + "attn.wo"], (-1, c.d_model)))
            sd[h + "attention.output.dense.bias"] = P[p + "attn.bo"]
            sd[h + "attention.output.LayerNorm.weight"] = P[p + "norm1.scale"]
            sd[h + "attention.output.LayerNorm.bias"] = P[p + "norm1.shift"]
            sd[h + "intermediate.dense.weight"] = T(P[p + "mlp.w_in"])
            sd[h + "intermediate.dense.bias"] = P[p + "mlp.b_in"]
            sd[h + "output.dense.weight"] = T(P[p + "mlp.w_out"])
            sd[h + "output.dense.bias"] = P[p + "mlp.b_out"]
            sd[h + "output.LayerNorm.weight"] = P[p + "norm2.scale"]
            sd[h + "output.LayerNorm.bias"] = P[p + "norm2.shift"]
    else:
        sd["model.embed_tokens.weight"] = P["embed"]
        for i in range(c.n_layers):
            h, p = f"model.layers.{i}.", f"layers.{i}."
            for n in "qkv":
                sd[h + f"self_attn.{n}_proj.weight"] = T(_heads_out(P[p + f"attn.w{n}"], xp))
            sd[h + "self_attn.o_proj.weight"] = T(xp.reshape(P[p + "attn.wo"], (-1, c.d_model)))
            sd[h + "input_layernorm.weight"] = P[p + "norm1.scale"]
            sd[h + "post_attention_layernorm.weight"] = P[p + "norm2.scale"]
            sd[h + "mlp.gate_proj.weight"] = T(P[p + "mlp.w_gate"])
            sd[h + "mlp.up_proj.weight"] = T(P[p + "mlp.w_in"])
            sd[h + "mlp.down_proj.weight"] = T(P[p + "mlp.w_out"])
        sd["model.norm.weight"] = P["final_norm.scale"]
        if not c.tie_embeddings:
            sd["lm_head.weight"] = T(P["unembed"])
    return sd


_META_KEY = "geoarray_config"


def _infer_arch(names: Any) -> str:
    names = list(names)
    if any(".attn.c_attn." in k for k in names):
        return "gpt2"
    if any(".attention.self.query." in k for k in names):
        return "bert"
    if any(".self_attn.q_proj." in k for k in names):
        return "llama"
    raise ValueError("checkpoint: cannot tell the layout (no GPT-2, BERT or LLaMA attention weights found)")


def _resolve_checkpoint_path(path: Any) -> tuple[str, str | None]:
    path = os.fspath(path)
    if os.path.isdir(path):
        st = os.path.join(path, "model.safetensors")
        if not os.path.isfile(st):
            raise ValueError(f"checkpoint directory {path!r} has no model.safetensors")
        cfg = os.path.join(path, "config.json")
        return st, cfg if os.path.isfile(cfg) else None
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path!r} does not exist")
    cfg = os.path.join(os.path.dirname(path) or ".", "config.json")
    return path, cfg if os.path.isfile(cfg) else None


def load_checkpoint(
    path: Any, config: Any = None, *, xp: Any = None, dtype: Any = None, device: Any = None
) -> tuple[TransformerLM, dict[str, Array]]:
    """``(model, params)`` from a safetensors file in a Hugging Face layout (or a directory holding
    ``model.safetensors``).

    The configuration comes from ``config`` if given, else from the file's ``geoarray_config``
    metadata (written by :func:`save_checkpoint`), else from a ``config.json`` beside the file
    (Hugging Face format). Arrays are converted to ``xp`` (NumPy by default) in ``dtype``
    (float64 by default, wherever available).
    """
    try:
        from safetensors import safe_open
        from safetensors.numpy import load_file
    except ImportError:
        raise ImportError("reading a safetensors checkpoint needs safetensors: pip install 'geoarray[gauge]'") from None

    st_path, cfg_path = _resolve_checkpoint_path(path)
    try:
        sd = load_file(st_path)
        with safe_open(st_path, "np") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # safetensors raises its own SafetensorError for an empty, truncated or foreign file
        raise ValueError(
            f"checkpoint {st_path!r} is damaged, truncated or not a safetensors file ({type(exc).__name__}: {exc})"
        ) from None
    if config is None:
        if _META_KEY in meta:
            config = json.loads(meta[_META_KEY])
        elif cfg_path is not None:
            with open(cfg_path) as fh:
                config = config_from_hf(json.load(fh))
        else:
            try:
                layout = f"looks like {_infer_arch(sd)}"
            except ValueError:
                layout = "not recognised"
            raise ValueError(
                f"checkpoint {st_path!r} carries no configuration (no geoarray metadata, no config.json beside it); "
                f"pass config= (layout {layout})"
            )
    c = as_config(config)
    import numpy as np

    xp = as_namespace(np if xp is None else xp)
    dt = resolve_dtype(xp, dtype, device)
    sd = {k: v for k, v in sd.items() if np.issubdtype(v.dtype, np.floating)}
    host = from_hf_state_dict(c, sd)
    params = {}
    for k, v in host.items():
        arr = np.ascontiguousarray(v, dtype=np.float64)
        params[k] = xp.asarray(arr, dtype=dt) if device is None else xp.asarray(arr, dtype=dt, device=device)
    return TransformerLM(c), params


def save_checkpoint(path: Any, model: Any, params: Mapping[str, Array], *, dtype: str = "float32") -> None:
    """Write ``params`` as a safetensors file with the Hugging Face names of the model's layout.

    The configuration goes into the file's metadata (``geoarray_config``), so
    :func:`load_checkpoint` needs nothing else; Hugging Face readers ignore it.
    """
    import numpy as np
    from safetensors.numpy import save_file

    from .._backend import to_host

    c = as_config(model)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    sd = to_hf_state_dict(c, params)
    host = {k: np.ascontiguousarray(to_host(v), dtype=dtype) for k, v in sd.items()}
    save_file(host, os.fspath(path), metadata={_META_KEY: json.dumps(c.to_dict())})

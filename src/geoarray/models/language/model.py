"""``TransformerLM``: the GPT-2-, LLaMA- and BERT-style stacks (see the package docstring), their
parameter shapes and counts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

from ... import random as _random
from ..._backend import array_namespace, as_namespace, resolve_dtype
from ..._typing import Array
from ...nn.activations import log_softmax
from .config import LanguageModelConfig, as_config
from .functions import activation, apply_rope, layer_norm, rms_norm, rope_tables, silu

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
        eps = cast(float, c.norm_eps)  # the config's __post_init__ filled in the arch's default
        if c.norm == "rmsnorm":
            return rms_norm(x, params[name + ".scale"], eps)
        return layer_norm(x, params[name + ".scale"], params[name + ".shift"], eps)

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
            # full, not asarray: a number copied from the host to a CUDA device is a synchronisation
            scores = xp.where(causal, scores, xp.full((), -xp.inf, dtype=scores.dtype, device=_device(h)))
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
            u = silu(h @ params[p + "mlp.w_gate"]) * (h @ params[p + "mlp.w_in"])
            return u @ params[p + "mlp.w_out"]
        u = h @ params[p + "mlp.w_in"] + params[p + "mlp.b_in"]
        act = cast(str, c.activation)  # the config's __post_init__ filled in the arch's default
        return activation(act, u) @ params[p + "mlp.w_out"] + params[p + "mlp.b_out"]

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
                x + self._embed(params["type"], types),
                params["emb_norm.scale"],
                params["emb_norm.shift"],
                cast(float, c.norm_eps),
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
            return log_softmax(self.logits(params, tokens))
        return self.hidden_states(params, tokens, token_types)

    __call__ = apply


def _device(x: Array) -> Any:
    from ..._backend import device

    return device(x)

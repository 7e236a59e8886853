"""Gauge fixing: a canonical form of the parameters that stores only the non-redundant ones.

:func:`gauge_fix` moves the parameters along their gauge orbit to a canonical point (same outputs)
where a known set of entries takes fixed values (identity blocks, zeros, ones, signs), and returns a
:class:`GaugeFixedLM` that stores only the other entries. Per source of
:func:`geoarray.gauge.counting` (in the row-vector convention of :mod:`geoarray.models.language`):

``norm_scale``, ``norm_shift``
    pre-norms folded into the next linear maps and biases (γ = 1, β = 0 stored implicitly); the final
    norm into an untied unembedding (γ_f = 1, and β_f = 1 after trading it against the row-means of U);
    post-LN: every inner β moved into the next biases (the readers' and the sublayer's output bias).
``read_mean``
    the row of each reading matrix that corresponds to the last feature is made zero (W − 1⊗W[last]
    for LayerNorm outputs, W − (γ_last/γ)⊗W[last] for γ ⊙ n).
``qk_gl``, ``vo_gl``
    per head, the first d_h rows of W_Q and of W_V become the identity: A = (W_Q[:d_h])⁻¹ is applied to
    W_Q, W_K takes A⁻ᵀ = W_Q[:d_h]ᵀ; B = (W_V[:d_h])⁻¹ on W_V, W_O takes W_V[:d_h].
``qk_rope``
    per head and frequency, the pair (W_Q[0, k], W_Q[0, k + d_h/2]) becomes (1, 0) (division by a
    complex number).
``key_bias``, ``value_bias``
    b_K = 0 (softmax ignores it); b_V = 0 after b_O ← b_O + Σ_h b_V,h W_O,h.
``write_mean``
    the last column of every write (W_O, b_O, W_out, b_out, embedding tables) is made zero.
``embedding_shift``
    P[0] = 0 (E absorbs it), and for tied GPT-2 E[0, last] = 0; BERT: P[0] = E[0] = 0 (the type table
    absorbs both).
``logit_shift``
    column 0 of an untied unembedding is zero.
``mlp_scale``
    column 0 of W_out is ±1 (ReLU: the sign is a fixed ±1 buffer, not a parameter) or 1 (SwiGLU).
``residual_rotation``
    RMSNorm: the first d rows of E become lower triangular (E[:d] = Rᵀ Qᵀ, the stream is rotated by
    Q). Not fixed for untied LayerNorm models (SO(d − 1) fixing 1 would need a basis change of the
    hyperplane ⊥ 1; :attr:`GaugeFixedLM.unfixed` reports it); tied models have no such symmetry.

The saving equals :func:`~geoarray.gauge.counting.redundancy` minus the unfixed sources. Numerical
caveat: the GL(d_h) steps invert d_h×d_h blocks of the weights; a nearly singular block would lose
accuracy (none of the random or real checkpoints tried came near; the check reports the output
difference).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _backend
from .._backend import array_namespace, to_host
from ..models.language import TransformerLM, as_config
from .counting import redundancy
from .transforms import GaugeElement, apply_gauge, fold_norms, rope_commutant

__all__ = ["GaugeFixedLM", "canonicalize", "gauge_fix"]

from .._typing import Array


def _minus_last_row(W: Array) -> Array:
    return W - W[..., -1:, :]


def _minus_last_col(W: Array) -> Array:
    return W - W[..., -1:]


def _vec_mat(v: Array, W: Array, xp: Any) -> Array:
    return xp.squeeze(v[..., None, :] @ W, axis=-2)


def _fix_heads(P: dict[str, Array], p: str, xp: Any, rope: bool) -> None:
    """qk and vo gauge fixing of one layer (biases already zero where they are redundant)."""
    dh = P[p + "attn.wq"].shape[-1]
    if rope:
        half = dh // 2
        row = P[p + "attn.wq"][:, 0, :]
        q1, q2 = row[:, :half], row[:, half:]
        r2 = q1 * q1 + q2 * q2
        A = rope_commutant(q1 / r2, -q2 / r2)
    else:
        top = P[p + "attn.wq"][:, :dh, :]
        A = xp.linalg.inv(top)
    P[p + "attn.wq"] = P[p + "attn.wq"] @ A
    P[p + "attn.wk"] = P[p + "attn.wk"] @ xp.linalg.inv(xp.matrix_transpose(A))
    if p + "attn.bq" in P:
        P[p + "attn.bq"] = _vec_mat(P[p + "attn.bq"], A, xp)
    top = P[p + "attn.wv"][:, :dh, :]
    P[p + "attn.wv"] = P[p + "attn.wv"] @ xp.linalg.inv(top)
    P[p + "attn.wo"] = top @ P[p + "attn.wo"]


def _fix_biases(P: dict[str, Array], p: str, xp: Any) -> None:
    P[p + "attn.bo"] = P[p + "attn.bo"] + xp.sum(_vec_mat(P[p + "attn.bv"], P[p + "attn.wo"], xp), axis=0)
    P[p + "attn.bv"] = xp.zeros_like(P[p + "attn.bv"])
    P[p + "attn.bk"] = xp.zeros_like(P[p + "attn.bk"])


def _fix_mlp_scale(P: dict[str, Array], p: str, xp: Any, positive: bool) -> Array:
    first = P[p + "mlp.w_out"][:, 0]
    s = xp.abs(first) if positive else first
    P[p + "mlp.w_in"] = P[p + "mlp.w_in"] * s
    if p + "mlp.b_in" in P:
        P[p + "mlp.b_in"] = P[p + "mlp.b_in"] * s
    P[p + "mlp.w_out"] = P[p + "mlp.w_out"] / s[:, None]
    return _backend.sign(first, xp)


def canonicalize(model: Any, params: Mapping[str, Array]) -> tuple[dict[str, Array], dict[str, Array]]:
    """The canonical point of the gauge orbit of ``params`` (same outputs) and the sign buffers of
    ReLU units (``{"layers.i.mlp.sign": (d_ff,)}``, empty otherwise)."""
    model = model if isinstance(model, TransformerLM) else TransformerLM(model)
    model.check_params(params)
    c = model.config
    xp = array_namespace(params["embed"])
    L, dh, d = c.n_layers, c.d_head, c.d_model
    if c.norm == "layernorm" and dh > d - 1:
        raise ValueError(f"gauge fixing needs d_head ≤ d_model − 1 for LayerNorm models, got {dh} and {d}")
    if dh > d:
        raise ValueError(f"gauge fixing needs d_head ≤ d_model, got {dh} and {d}")
    signs: dict[str, Array] = {}
    if c.arch == "gpt2":
        P = fold_norms(model, params)
        for layer in range(L):
            p = f"layers.{layer}."
            for r in ("attn.wq", "attn.wk", "attn.wv", "mlp.w_in"):
                P[p + r] = _minus_last_row(P[p + r])
            _fix_biases(P, p, xp)
            _fix_heads(P, p, xp, rope=False)
            for w in ("attn.wo", "attn.bo", "mlp.w_out", "mlp.b_out"):
                P[p + w] = _minus_last_col(P[p + w])
            if c.activation == "relu":
                signs[p + "mlp.sign"] = _fix_mlp_scale(P, p, xp, positive=True)
        u = P["pos"][0, :]
        P["pos"] = _minus_last_col(P["pos"] - u)
        P["embed"] = P["embed"] + u
        if c.tie_embeddings:
            P["embed"] = P["embed"] - P["embed"][0, -1]
        else:
            P["embed"] = _minus_last_col(P["embed"])
            beta, U = P["final_norm.shift"], P["unembed"]
            delta = xp.ones_like(beta) - beta
            P["unembed"] = U - _vec_mat(delta, U, xp)[None, :] / d
            P["final_norm.shift"] = xp.ones_like(beta)
            P["unembed"] = P["unembed"] - P["unembed"][:, :1]
    elif c.arch == "llama":
        P = fold_norms(model, params)
        if not c.tie_embeddings:
            if c.vocab < d:
                raise ValueError(f"gauge fixing the residual rotation needs vocab ≥ d_model, got {c.vocab} < {d}")
            Q, _ = xp.linalg.qr(xp.matrix_transpose(P["embed"][:d, :]))
            model_u = TransformerLM(c)
            _, P = apply_gauge(model_u, P, GaugeElement(residual=Q))
        for layer in range(L):
            p = f"layers.{layer}."
            _fix_heads(P, p, xp, rope=True)
            _fix_mlp_scale(P, p, xp, positive=False)
        if not c.tie_embeddings:
            P["unembed"] = P["unembed"] - P["unembed"][:, :1]
    else:  # bert
        P = dict(params)
        # inner norms: β into the readers' biases and the next sublayer's output bias
        chain: list[tuple[str, str, tuple[str, ...], str]] = [
            ("emb_norm", "layers.0.", ("attn.wq", "attn.wk", "attn.wv"), "layers.0.attn.bo")
        ]
        for layer in range(L):
            p = f"layers.{layer}."
            chain.append((p + "norm1", p, ("mlp.w_in",), p + "mlp.b_out"))
            if layer + 1 < L:
                q = f"layers.{layer + 1}."
                chain.append((p + "norm2", q, ("attn.wq", "attn.wk", "attn.wv"), q + "attn.bo"))
        bias_of = {"attn.wq": "attn.bq", "attn.wk": "attn.bk", "attn.wv": "attn.bv", "mlp.w_in": "mlp.b_in"}
        for norm, reader, mats, out_bias in chain:
            beta, gamma = P[norm + ".shift"], P[norm + ".scale"]
            for m in mats:
                P[reader + bias_of[m]] = P[reader + bias_of[m]] + _vec_mat(beta, P[reader + m], xp)
                # x = γ ⊙ n is orthogonal to 1/γ: the row of the last feature can be made zero
                W = P[reader + m]
                P[reader + m] = W - (gamma[-1] / gamma)[:, None] * W[..., -1:, :]
            P[out_bias] = P[out_bias] + beta
            P[norm + ".shift"] = xp.zeros_like(beta)
        for layer in range(L):
            p = f"layers.{layer}."
            _fix_biases(P, p, xp)
            _fix_heads(P, p, xp, rope=False)
            for w in ("attn.wo", "attn.bo", "mlp.w_out", "mlp.b_out"):
                P[p + w] = _minus_last_col(P[p + w])
            if c.activation == "relu":
                signs[p + "mlp.sign"] = _fix_mlp_scale(P, p, xp, positive=True)
        P["type"] = P["type"] + P["pos"][0, :] + P["embed"][0, :]
        P["pos"] = _minus_last_col(P["pos"] - P["pos"][0, :])
        P["embed"] = _minus_last_col(P["embed"] - P["embed"][0, :])
        P["type"] = _minus_last_col(P["type"])
    return P, signs


def _layout(config: Any, signs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]]:
    """Host masks (True = stored) and fixed values of the canonical form; the unfixed sources."""
    c = as_config(config)
    shapes = TransformerLM(c).param_shapes()
    free = {k: np.ones(s, dtype=bool) for k, s in shapes.items()}
    fixed = {k: np.zeros(s) for k, s in shapes.items()}
    L, dh, d = c.n_layers, c.d_head, c.d_model
    unfixed: list[str] = []

    def const(name: str, value: float) -> None:
        free[name][...] = False
        fixed[name][...] = value

    ln = c.norm == "layernorm"
    for layer in range(L):
        p = f"layers.{layer}."
        if c.arch != "bert":
            for norm in ("norm1", "norm2"):
                const(p + norm + ".scale", 1.0)
                if ln:
                    const(p + norm + ".shift", 0.0)
        else:
            const(p + "norm1.shift", 0.0)
            if layer + 1 < L:
                const(p + "norm2.shift", 0.0)
        for m in ("attn.wq", "attn.wk", "attn.wv", "mlp.w_in"):
            if ln:
                free[p + m][..., -1, :] = False
        if c.arch == "llama":
            free[p + "attn.wq"][:, 0, :] = False
            fixed[p + "attn.wq"][:, 0, : dh // 2] = 1.0
        else:
            free[p + "attn.wq"][:, :dh, :] = False
            fixed[p + "attn.wq"][:, :dh, :] = np.eye(dh)
        free[p + "attn.wv"][:, :dh, :] = False
        fixed[p + "attn.wv"][:, :dh, :] = np.eye(dh)
        if c.biases:
            const(p + "attn.bk", 0.0)
            const(p + "attn.bv", 0.0)
        if ln:
            for w in ("attn.wo", "attn.bo", "mlp.w_out", "mlp.b_out"):
                free[p + w][..., -1] = False
        if c.activation == "relu":
            free[p + "mlp.w_out"][:, 0] = False
            fixed[p + "mlp.w_out"][:, 0] = np.asarray(signs[p + "mlp.sign"])
        elif c.activation == "swiglu":
            free[p + "mlp.w_out"][:, 0] = False
            fixed[p + "mlp.w_out"][:, 0] = 1.0
    if c.arch == "gpt2":
        free["pos"][0, :] = False
        free["pos"][:, -1] = False
        if c.tie_embeddings:
            free["embed"][0, -1] = False
        else:
            free["embed"][:, -1] = False
            const("final_norm.scale", 1.0)
            const("final_norm.shift", 1.0)
            free["unembed"][:, 0] = False
            unfixed.append("residual_rotation")
    elif c.arch == "llama":
        if not c.tie_embeddings:
            free["embed"][:d, :] &= ~np.triu(np.ones((d, d), dtype=bool), k=1)
            const("final_norm.scale", 1.0)
            free["unembed"][:, 0] = False
    else:
        const("emb_norm.shift", 0.0)
        for t in ("embed", "pos"):
            free[t][0, :] = False
            free[t][:, -1] = False
        free["type"][:, -1] = False
    return free, fixed, unfixed


class GaugeFixedLM:
    """A gauge-fixed transformer: ``apply(reduced, tokens)`` equals the original model's outputs,
    with ``n_params()`` = original − ``saving`` parameters.

    ``reduced`` is a dict name → 1-D array of the stored (free) entries of each parameter of the
    original layout; :meth:`expand` rebuilds the full parameters (fixed entries from
    :attr:`fixed`: identity blocks, zeros, ones, ReLU signs) with one gather and one ``where`` per
    parameter, so the forward pass runs on every backend and traces under ``jax.jit``.
    """

    def __init__(self, config: Any, signs: Mapping[str, Any] | None = None):
        self.config = as_config(config)
        self.base = TransformerLM(self.config)
        self.signs = {
            k: np.asarray(to_host(v) if not isinstance(v, np.ndarray) else v) for k, v in (signs or {}).items()
        }
        self.free, self.fixed, self.unfixed = _layout(self.config, self.signs)
        self._index = {}
        for k, m in self.free.items():
            idx = np.zeros(m.size, dtype=np.int64)
            flat = m.reshape(-1)
            idx[flat] = np.arange(int(flat.sum()))
            self._index[k] = idx
        self._cache: dict[Any, dict[str, tuple[Array, Array, Array]]] = {}

    def __repr__(self) -> str:
        return f"GaugeFixedLM({self.config.arch}, n_params={self.n_params()}, saving={self.saving})"

    def reduced_sizes(self) -> dict[str, int]:
        return {k: int(m.sum()) for k, m in self.free.items()}

    def n_params(self) -> int:
        return sum(self.reduced_sizes().values())

    @property
    def saving(self) -> int:
        return self.base.n_params() - self.n_params()

    @property
    def saving_breakdown(self) -> dict[str, int]:
        """The sources of :func:`~geoarray.gauge.counting.redundancy` that this form removes."""
        return {k: v for k, v in redundancy(self.config).breakdown.items() if k not in self.unfixed}

    def reduce(self, params: Mapping[str, Array]) -> dict[str, Array]:
        """The stored entries of canonical ``params`` (as returned by :func:`canonicalize`)."""
        xp = array_namespace(params["embed"])
        out = {}
        for k, m in self.free.items():
            if not m.any():
                continue
            pos = np.flatnonzero(m.reshape(-1))
            flat = xp.reshape(params[k], (-1,))
            out[k] = xp.take(flat, xp.asarray(pos, device=_dev(flat)), axis=0)
        return out

    def _constants(self, xp: Any, dtype: Any, device: Any) -> dict[str, tuple[Array, Array, Array]]:
        key = (id(xp), str(dtype), str(device))
        if key not in self._cache:
            kw = {} if device is None else {"device": device}
            self._cache[key] = {
                k: (
                    xp.asarray(self.free[k], **kw),
                    xp.asarray(self.fixed[k], dtype=dtype, **kw),
                    xp.asarray(self._index[k].reshape(self.free[k].shape), **kw),
                )
                for k in self.free
            }
        return self._cache[key]

    def expand(self, reduced: Mapping[str, Array]) -> dict[str, Array]:
        """Full parameters of the original layout from the stored entries."""
        if not isinstance(reduced, Mapping):
            raise TypeError(f"reduced must be a dict of arrays, got {type(reduced).__name__}")
        sizes = self.reduced_sizes()
        expected = {k for k, n in sizes.items() if n}
        if set(reduced) != expected:
            raise ValueError(
                "reduced parameters do not match the gauge-fixed layout: "
                f"missing {sorted(expected - set(reduced))[:5]}, unexpected {sorted(set(reduced) - expected)[:5]}"
            )
        for k in expected:
            if tuple(reduced[k].shape) != (sizes[k],):
                raise ValueError(f"reduced[{k!r}] must have shape {(sizes[k],)}, got {tuple(reduced[k].shape)}")
        first = next(iter(reduced.values()))
        xp = array_namespace(first)
        consts = self._constants(xp, first.dtype, _dev(first))
        out = {}
        for k, (mask, fixed, idx) in consts.items():
            if k in reduced:
                out[k] = xp.where(
                    mask, xp.reshape(xp.take(reduced[k], xp.reshape(idx, (-1,)), axis=0), idx.shape), fixed
                )
            else:
                out[k] = fixed
        return out

    def apply(self, reduced: Mapping[str, Array], tokens: Array, token_types: Array | None = None) -> Array:
        return self.base.apply(self.expand(reduced), tokens, token_types)

    __call__ = apply


def _dev(x: Array) -> Any:
    from .._backend import device

    return device(x)


def gauge_fix(model: Any, params: Mapping[str, Array]) -> tuple[GaugeFixedLM, dict[str, Array]]:
    """``(fixed_model, reduced)``: the canonical form of ``params`` with only its free entries stored.

    ``fixed_model.apply(reduced, tokens)`` equals ``model.apply(params, tokens)`` (float64: to ~1e-12
    on the configurations tested) and ``fixed_model.saving`` equals
    ``redundancy(config).total`` minus the sources in ``fixed_model.unfixed`` (only
    ``residual_rotation`` of untied LayerNorm decoders).
    """
    model = model if isinstance(model, TransformerLM) else TransformerLM(model)
    canon, signs = canonicalize(model, params)
    fixed = GaugeFixedLM(model.config, signs)
    return fixed, fixed.reduce(canon)

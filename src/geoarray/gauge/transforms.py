"""Gauge transformations of transformer stacks: sample a group element, fold the norms, apply it.

The group (van Nierop, "Transformer models are gauge invariant", section 4.4, with the corrections
of :mod:`geoarray.gauge.counting`), in the row-vector convention of :mod:`geoarray.models.language`
(the residual stream is ``x`` of shape ``(..., T, d)``):

* residual stream ``x → x G``: G orthogonal with G·1 = 1 (SO(d − 1) fixing the all-ones vector,
  LayerNorm, eq. 6–7 and 14) or any G ∈ SO(d) (RMSNorm). Every write to the stream is multiplied by G
  on the right (``E``, ``P``, ``W_O``, ``b_O``, ``W_out``, ``b_out``), every read by Gᵀ on the left
  (``W_Q``, ``W_K``, ``W_V``, ``W_in``, ``W_gate``, the unembedding). This is a symmetry only after the
  norms are folded (:func:`fold_norms`): LN(xG) = LN(x)G holds for the bare normalisation
  (x − mean x)/√(var x + ε) because G preserves 1 and lengths, but not for γ ⊙ (·) + β unless
  γ = 1 and β = 0. With tied embeddings the unembedding must first be untied (:func:`untie`).
* per layer and head, queries/keys ``W_Q → W_Q A``, ``b_Q → b_Q A``, ``W_K → W_K A⁻ᵀ``, ``b_K → b_K A⁻ᵀ``
  with A ∈ GL(d_h) (eq. 8–9, 15), or, with rotary embeddings, A in the commutant of the rotations
  (per frequency a 2×2 block [[a, b], [−b, a]]: multiplication by the complex number a + ib);
* per layer and head, values/outputs ``W_V → W_V B``, ``b_V → b_V B``, ``W_O → B⁻¹ W_O`` (eq. 10–11, 16);
* per layer and hidden unit of a ReLU or SwiGLU MLP, ``W_in[:, j] → s_j W_in[:, j]``
  (and ``b_in``), ``W_out[j] → W_out[j]/s_j``: s_j > 0 for ReLU, s_j ≠ 0 for the linear (up) branch of SwiGLU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _backend
from .. import random as _random
from .._backend import array_namespace, as_namespace, resolve_dtype
from ..models.language import TransformerLM

__all__ = [
    "GaugeElement",
    "apply_gauge",
    "fold_norms",
    "haar_orthogonal",
    "haar_rotation_fixing_ones",
    "random_gauge",
    "random_gl",
    "untie",
]

from .._typing import Array


def _kw(device: Any) -> dict[str, Any]:
    return {} if device is None else {"device": device}


def haar_orthogonal(
    n: int, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None, special: bool = True
) -> Array:
    """A Haar-distributed n×n orthogonal matrix (in SO(n) when ``special``).

    QR of a Gaussian matrix with the signs of R's diagonal moved into Q (Mezzadri, "How to generate
    random matrices from the classical compact groups"); for SO(n) the first column is negated when
    det Q = −1, which maps the Haar measure of O(n)'s other component onto SO(n).
    """
    xp = as_namespace(xp)
    Z = _random.normal(seed, (n, n), xp=xp, dtype=dtype, device=device)
    Q, R = xp.linalg.qr(Z)
    Q = Q * _backend.sign(xp.linalg.diagonal(R), xp)[None, :]
    if special:
        det = xp.linalg.det(Q)
        flip = xp.concat([xp.reshape(det, (1,)), xp.ones((n - 1,), dtype=Q.dtype, **_kw(device))])
        Q = Q * flip[None, :]
    return Q


def _ones_complement_basis(d: int, *, xp: Any, dtype: Any, device: Any) -> Array:
    """An orthonormal basis (d, d − 1) of the hyperplane orthogonal to the all-ones vector."""
    M = xp.eye(d, dtype=dtype, **_kw(device))
    M = xp.concat([xp.ones((d, 1), dtype=dtype, **_kw(device)), M[:, : d - 1]], axis=1)
    Q, _ = xp.linalg.qr(M)
    return Q[:, 1:]


def haar_rotation_fixing_ones(d: int, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> Array:
    """A Haar-random G ∈ SO(d) with G·1 = 1: the paper's SO(d_e − 1) acting on the hyperplane ⊥ 1.

    G = B R Bᵀ + 11ᵀ/d with B an orthonormal basis of 1^⊥ and R Haar in SO(d − 1).
    """
    xp = as_namespace(xp)
    dtype = resolve_dtype(xp, dtype, device)
    B = _ones_complement_basis(d, xp=xp, dtype=dtype, device=device)
    R = haar_orthogonal(d - 1, seed, xp=xp, dtype=dtype, device=device)
    return B @ R @ xp.matrix_transpose(B) + xp.ones((d, d), dtype=dtype, **_kw(device)) / d


def random_gl(
    n: int, seed: Any, *, batch_shape: tuple[int, ...] = (), xp: Any, dtype: Any = None, device: Any = None
) -> Array:
    """Random invertible n×n matrices :math:`U \\operatorname{diag}(e^{t}) V` with U, V Haar-orthogonal and t uniform in
    [−1/2, 1/2]: condition number ≤ e, distance O(1) from the identity."""
    xp = as_namespace(xp)
    count = math.prod(batch_shape)
    seeds = _random.spawn(seed, 3 * count)
    mats = []
    for i in range(count):
        U = haar_orthogonal(n, seeds[3 * i], xp=xp, dtype=dtype, device=device, special=False)
        V = haar_orthogonal(n, seeds[3 * i + 1], xp=xp, dtype=dtype, device=device, special=False)
        t = _random.uniform(seeds[3 * i + 2], (n,), xp=xp, low=-0.5, high=0.5, dtype=dtype, device=device)
        mats.append((U * xp.exp(t)[None, :]) @ V)
    return xp.reshape(xp.stack(mats), (*batch_shape, n, n))


def rope_commutant(a: Array, b: Array) -> Array:
    """The d_h×d_h matrices [[diag a, diag b], [−diag b, diag a]] (rotate-half layout) from a, b of shape
    (..., d_h/2): right multiplication by them is multiplication of each feature pair by a + ib, which
    commutes with every rotary position rotation."""
    xp = array_namespace(a, b)
    h = a.shape[-1]
    eye = xp.eye(h, dtype=a.dtype, **_kw(_dev(a)))
    da = a[..., :, None] * eye
    db = b[..., :, None] * eye
    top = xp.concat([da, db], axis=-1)
    bottom = xp.concat([-db, da], axis=-1)
    return xp.concat([top, bottom], axis=-2)


def _dev(x: Array) -> Any:
    from .._backend import device

    return device(x)


@dataclass
class GaugeElement:
    """One element of the gauge group of a model (None: identity for that factor).

    ``residual`` (d, d); ``qk``, ``vo`` lists over layers of (H, d_h, d_h); ``mlp`` a list over layers
    of (d_ff,) scalings.
    """

    residual: Array | None = None
    qk: list[Array | None] = field(default_factory=list)
    vo: list[Array | None] = field(default_factory=list)
    mlp: list[Array | None] = field(default_factory=list)

    def describe(self, model: TransformerLM) -> str:
        c = model.config
        parts = []
        if self.residual is not None:
            parts.append(f"SO({c.d_model - 1}) fixing 1" if c.norm == "layernorm" else f"SO({c.d_model})")
        if any(a is not None for a in self.qk):
            kind = f"RoPE commutant (dim {c.d_head})" if c.arch == "llama" else f"GL({c.d_head})"
            parts.append(f"{kind} on Q/K per head")
        if any(a is not None for a in self.vo):
            parts.append(f"GL({c.d_head}) on V/O per head")
        if any(a is not None for a in self.mlp):
            parts.append("MLP unit scalings")
        return " × ".join(parts) if parts else "identity"


def random_gauge(
    model: Any,
    seed: Any = 0,
    *,
    xp: Any,
    dtype: Any = None,
    device: Any = None,
    residual: bool | None = None,
    heads: bool = True,
    mlp: bool | None = None,
) -> GaugeElement:
    """A random group element for ``model``: Haar residual rotation (decoders; not for post-LN ``bert``),
    random GL(d_h) (or RoPE-commutant) pairs per head and layer, random MLP scalings (ReLU: :math:`e^{U(-1,1)}`;
    SwiGLU: also a random sign). ``residual``/``mlp`` None: wherever the architecture has them."""
    model = model if isinstance(model, TransformerLM) else TransformerLM(model)
    c = model.config
    xp = as_namespace(xp)
    dtype = resolve_dtype(xp, dtype, device)
    has_mlp = c.activation in ("relu", "swiglu")
    residual = c.decoder if residual is None else residual
    mlp = has_mlp if mlp is None else mlp
    if residual and not c.decoder:
        raise ValueError(
            "random_gauge: a post-LN encoder ('bert') has no residual-stream symmetry; pass residual=False"
        )
    if mlp and not has_mlp:
        raise ValueError(
            f"random_gauge: {c.activation} MLP units have no scaling symmetry (only ReLU and SwiGLU do); pass mlp=False"
        )
    s = _random.spawn(seed, 1 + 3 * c.n_layers)
    g = GaugeElement()
    if residual:
        if c.norm == "layernorm":
            g.residual = haar_rotation_fixing_ones(c.d_model, s[0], xp=xp, dtype=dtype, device=device)
        else:
            g.residual = haar_orthogonal(c.d_model, s[0], xp=xp, dtype=dtype, device=device)
    H, dh = c.n_heads, c.d_head
    for layer in range(c.n_layers):
        sq, sv, sm = s[1 + 3 * layer : 4 + 3 * layer]
        if heads:
            if c.arch == "llama":
                r = _random.uniform(sq, (2, H, dh // 2), xp=xp, low=-1.0, high=1.0, dtype=dtype, device=device)
                modulus, phase = xp.exp(r[0, ...] / 2), math.pi * r[1, ...]
                g.qk.append(rope_commutant(modulus * xp.cos(phase), modulus * xp.sin(phase)))
            else:
                g.qk.append(random_gl(dh, sq, batch_shape=(H,), xp=xp, dtype=dtype, device=device))
            g.vo.append(random_gl(dh, sv, batch_shape=(H,), xp=xp, dtype=dtype, device=device))
        else:
            g.qk.append(None)
            g.vo.append(None)
        if mlp:
            r = _random.uniform(sm, (2, c.d_ff), xp=xp, low=-1.0, high=1.0, dtype=dtype, device=device)
            scale = xp.exp(r[0, ...])
            if c.activation == "swiglu":
                scale = scale * xp.where(r[1, ...] < 0, -xp.ones_like(scale), xp.ones_like(scale))
            g.mlp.append(scale)
        else:
            g.mlp.append(None)
    return g


def untie(model: Any, params: Mapping[str, Array]) -> tuple[TransformerLM, dict[str, Array]]:
    """The same function with an untied unembedding ``unembed = embedᵀ`` (d_model more parameters × vocab)."""
    model = model if isinstance(model, TransformerLM) else TransformerLM(model)
    if not model.config.tie_embeddings:
        return model, dict(params)
    xp = array_namespace(params["embed"])
    out = dict(params)
    out["unembed"] = xp.matrix_transpose(params["embed"])
    return TransformerLM(model.config.replace(tie_embeddings=False)), out


def fold_norms(model: Any, params: Mapping[str, Array]) -> dict[str, Array]:
    """Fold the scale γ and shift β of every pre-norm into the linear maps that read it (same outputs).

    ``(γ ⊙ n + β) W + b = n (diag(γ) W) + (β W + b)``: W ← diag(γ) W, b ← b + β W, then γ = 1, β = 0.
    The final norm folds into an untied unembedding (U ← diag(γ_f) U, β_f ← β_f/γ_f, γ_f = 1: there
    is no logit bias to take β_f, so it stays and rotates with the stream); with tied embeddings it
    is left alone (:func:`untie` first). Post-LN encoders have nothing to fold: ValueError.
    """
    model = model if isinstance(model, TransformerLM) else TransformerLM(model)
    c = model.config
    if not c.decoder:
        raise ValueError(
            "fold_norms: in a post-LN encoder ('bert') the norm's output is the residual stream itself; "
            "there is nothing to fold"
        )
    model.check_params(params)
    xp = array_namespace(params["embed"])
    P = dict(params)
    for layer in range(c.n_layers):
        p = f"layers.{layer}."
        for norm, readers in (("norm1", ("attn.wq", "attn.wk", "attn.wv")), ("norm2", ("mlp.w_in", "mlp.w_gate"))):
            gamma = P[p + norm + ".scale"]
            beta = P.get(p + norm + ".shift")
            for r in readers:
                if p + r not in P:
                    continue
                W = P[p + r]
                if beta is not None:
                    bias = {"attn.wq": "attn.bq", "attn.wk": "attn.bk", "attn.wv": "attn.bv", "mlp.w_in": "mlp.b_in"}[r]
                    P[p + bias] = P[p + bias] + _row_times(beta, W, xp)
                P[p + r] = gamma[:, None] * W
            P[p + norm + ".scale"] = xp.ones_like(gamma)
            if beta is not None:
                P[p + norm + ".shift"] = xp.zeros_like(beta)
    if not c.tie_embeddings:
        gamma = P["final_norm.scale"]
        P["unembed"] = gamma[:, None] * P["unembed"]
        if "final_norm.shift" in P:
            P["final_norm.shift"] = P["final_norm.shift"] / gamma
        P["final_norm.scale"] = xp.ones_like(gamma)
    return P


def _row_times(v: Array, W: Array, xp: Any) -> Array:
    """v @ W for a vector v (d,) and W (..., d, k) → (..., k)."""
    return xp.squeeze(v[None, :] @ W, axis=-2)


def apply_gauge(
    model: Any, params: Mapping[str, Array], g: GaugeElement, *, fold: bool = True
) -> tuple[TransformerLM, dict[str, Array]]:
    """``(model', params')`` with params' = g·params (see the module docstring for the action).

    With a residual rotation, a tied model is untied first (:func:`untie`; the returned model has
    ``tie_embeddings=False``) and, with ``fold=True``, the norms are folded first (:func:`fold_norms`).
    ``fold=False`` applies the paper's formulas to the raw parameters, γ and β left in place: this
    is *not* a symmetry (the outputs change by O(1)), which is the point of folding.
    """
    model = model if isinstance(model, TransformerLM) else TransformerLM(model)
    model.check_params(params)
    c = model.config
    xp = array_namespace(params["embed"])
    P = dict(params)
    if g.residual is not None:
        if not c.decoder:
            raise ValueError("apply_gauge: a post-LN encoder ('bert') has no residual-stream symmetry")
        G = g.residual
        if tuple(G.shape) != (c.d_model, c.d_model):
            raise ValueError(f"g.residual must have shape {(c.d_model, c.d_model)}, got {tuple(G.shape)}")
        model, P = untie(model, P)
        c = model.config
        if fold:
            P = fold_norms(model, P)
        Gt = xp.matrix_transpose(G)
        for name in ("embed", "pos"):
            if name in P:
                P[name] = P[name] @ G
        for layer in range(c.n_layers):
            p = f"layers.{layer}."
            for r in ("attn.wq", "attn.wk", "attn.wv", "mlp.w_in", "mlp.w_gate"):
                if p + r in P:
                    P[p + r] = Gt @ P[p + r]
            for w in ("attn.wo", "mlp.w_out"):
                P[p + w] = P[p + w] @ G
            for b in ("attn.bo", "mlp.b_out"):
                if p + b in P:
                    P[p + b] = _row_times(P[p + b], G, xp)
        if fold and "final_norm.shift" in P:
            P["final_norm.shift"] = _row_times(P["final_norm.shift"], G, xp)
        P["unembed"] = Gt @ P["unembed"]
    for layer in range(c.n_layers):
        p = f"layers.{layer}."
        A = g.qk[layer] if layer < len(g.qk) else None
        if A is not None:
            A_it = xp.linalg.inv(xp.matrix_transpose(A))
            P[p + "attn.wq"] = P[p + "attn.wq"] @ A
            P[p + "attn.wk"] = P[p + "attn.wk"] @ A_it
            if c.biases:
                P[p + "attn.bq"] = xp.squeeze(P[p + "attn.bq"][:, None, :] @ A, axis=-2)
                P[p + "attn.bk"] = xp.squeeze(P[p + "attn.bk"][:, None, :] @ A_it, axis=-2)
        B = g.vo[layer] if layer < len(g.vo) else None
        if B is not None:
            P[p + "attn.wv"] = P[p + "attn.wv"] @ B
            P[p + "attn.wo"] = xp.linalg.inv(B) @ P[p + "attn.wo"]
            if c.biases:
                P[p + "attn.bv"] = xp.squeeze(P[p + "attn.bv"][:, None, :] @ B, axis=-2)
        s = g.mlp[layer] if layer < len(g.mlp) else None
        if s is not None:
            if c.activation not in ("relu", "swiglu"):
                raise ValueError(f"apply_gauge: {c.activation} MLP units have no scaling symmetry")
            P[p + "mlp.w_in"] = P[p + "mlp.w_in"] * s
            if c.biases:
                P[p + "mlp.b_in"] = P[p + "mlp.b_in"] * s
            P[p + "mlp.w_out"] = P[p + "mlp.w_out"] / s[:, None]
    return model, P

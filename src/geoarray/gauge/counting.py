"""How many parameters of a transformer stack are redundant: the paper's count, the exact count, a referee.

:func:`paper_redundancy` is eq. 17 of van Nierop, "Transformer models are gauge invariant":
``2·n_t·n_h·d_h² + (d_e − 1)(d_e − 2)/2`` (one GL(d_h) for queries/keys and one for values/outputs
per head and layer, plus SO(d_e − 1) on the residual stream).

:func:`redundancy` is the dimension of the set of parameter directions along which the model's
outputs do not change at a generic point: the nullity of the Jacobian of the outputs with respect to
all parameters. It is a sum of independent sources, each the dimension of a group of
reparametrisations (rotations, GL(d_h), scalings and translations), with a breakdown:

``residual_rotation``
    SO(d_e − 1) fixing the all-ones vector (LayerNorm) or SO(d_e) (RMSNorm) on the residual stream.
    Only with an *untied* unembedding: with tied embeddings the final norm's scale γ_f sits between
    E and Eᵀ (logits = (γ_f ⊙ n) Eᵀ), and a rotation G would need Gᵀ diag(γ_f) G diagonal, which for
    generic γ_f only the identity achieves (the infinitesimal condition Ω_ij(γ_j − γ_i) = w_j with Ω
    skew and Ω·1 = 0 forces Ω = 0). Post-LN encoders have none (the residual passes through γ ⊙ n + β).
``qk_gl`` / ``qk_rope``
    GL(d_h) per head: W_Q → W_Q A, W_K → W_K A⁻ᵀ (d_h² each). With rotary embeddings A must commute
    with every position rotation: block-diagonal 2×2 "complex scalars", d_h real dimensions per head.
``vo_gl``
    GL(d_h) per head: W_V → W_V B, W_O → B⁻¹ W_O (d_h² each).
``key_bias``
    b_K adds q_i·b_K to every score of row i, which softmax removes: d_h per head.
``value_bias``
    attention rows sum to one, so b_V W_O is a constant that b_O can take over: d_h per head.
``norm_scale`` / ``norm_shift``
    a pre-norm's γ and β fold into the next linear map and its bias (d each), the final norm's into an
    untied unembedding (γ_f: d; β_f: d, traded against the row-means of U). Post-LN: β of every
    norm but the last reaches the next linear maps (whose biases absorb β·W) and, through the
    residual, the next sum, where the output bias of the sublayer (b_O or b_out) absorbs it: d per
    inner norm.
``read_mean``
    a LayerNorm output n is orthogonal to the all-ones vector, so a linear map reading γ ⊙ n + β has a
    dead row direction W → W + (1/γ) cᵀ (with b → b − (β·(1/γ)) c): one per output unit of Q, K, V and
    of the MLP input.
``write_mean``
    everything written to the residual stream of a LayerNorm model is read through a centring, so the
    all-ones component of each write is dead: one per column of W_O, per MLP unit of W_out, per
    bias b_O, b_out, per position embedding, per token embedding (untied or encoder), per type.
``embedding_shift``
    E + u, P − u leave E[t] + P[i] unchanged (d_e − 1 new directions besides write_mean; for BERT two
    such shifts against the type table). With tied GPT-2 embeddings all d_e count: the logits change
    by a per-position constant, which log-softmax removes.
``logit_shift``
    U → U + u 1ᵀ changes every logit of a position by the same amount: d_e (untied decoders).
``mlp_scale``
    positively homogeneous (ReLU) or gated (SwiGLU, the up projection) units: W_in[:, j] → s W_in[:, j],
    W_out[j] → W_out[j]/s, one per hidden unit. The paper's f = 1 (after eq. 16) misses these; tanh/erf
    GELU units have none. (For ReLU the count assumes every unit is active on some inputs and inactive
    on others; an always-active unit is linear and its bias could move into b_out.)

Where this differs from eq. 17 (gpt2: 1,347,352 against 1,473,409): eq. 17 counts the residual
rotation, which tied embeddings break (−293,761), and misses the norm, bias, mean and embedding
directions (+167,704). For LLaMA-65B (121,180,160 against 201,314,305): RoPE leaves d_h instead of
d_h² per head for queries/keys (−83,230,720), RMSNorm gives SO(d_e) rather than SO(d_e − 1)
(+8,191), the norm scales (+1,318,912), SwiGLU units (+1,761,280) and the logit shift (+8,192) add.

:func:`numerical_redundancy` is the referee: the nullity of the Jacobian on many inputs, by SVD.
Outputs are log-probabilities for decoders (so a per-position shift of the logits is invisible) and
hidden states for the encoder. Approximate symmetries broken only by the norms' ε (rescaling the
residual stream: one for pre-norm decoders, 2L + 1 for post-LN encoders) have singular values that
shrink with ε; they are not symmetries and not counted, but they look null when ε is tiny (e.g.
BERT's default ε = 1e-12; :func:`numerical_redundancy` gives measured values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .. import _backend
from .._backend import array_namespace
from ..models.language import LanguageModelConfig, TransformerLM, as_config, count_params

__all__ = [
    "NumericalRedundancy",
    "Redundancy",
    "numerical_redundancy",
    "paper_redundancy",
    "redundancy",
    "referee_inputs",
]

from .._typing import Array


def paper_redundancy(n_layers: int, n_heads: int, d_head: int, d_model: int) -> int:
    """Eq. 17 of van Nierop: 2·n_t·n_h·d_h² + (d_e − 1)(d_e − 2)/2 (gpt2: 12, 12, 64, 768 → 1,473,409)."""
    for name, v in (("n_layers", n_layers), ("n_heads", n_heads), ("d_head", d_head), ("d_model", d_model)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return 2 * n_layers * n_heads * d_head**2 + (d_model - 1) * (d_model - 2) // 2


@dataclass(frozen=True)
class Redundancy:
    """The exact count: ``total`` and its ``breakdown`` by source (see the module docstring)."""

    total: int
    breakdown: dict[str, int]
    n_params: int
    paper: int
    config: LanguageModelConfig = field(repr=False)

    def __int__(self) -> int:
        return self.total

    def __index__(self) -> int:
        return self.total

    @property
    def fraction(self) -> float:
        return self.total / self.n_params


def redundancy(config: Any) -> Redundancy:
    """The exact number of continuous symmetries (Jacobian nullity at a generic point) of the model.

    ``config``: a dict (keys of :class:`geoarray.models.LanguageModelConfig`), a config, a
    :class:`TransformerLM` or a preset name (``"gpt2"``, ``"gpt2-xl"``, ``"llama-65b"``,
    ``"all-minilm-l6-v2"``). Valid when ``vocab > d_model`` and ``d_head < d_model`` (a generic point then
    has no further degeneracy); :func:`numerical_redundancy` verifies it on small configurations.
    """
    c = as_config(config)
    L, H, dh, d, f, V, n = c.n_layers, c.n_heads, c.d_head, c.d_model, c.d_ff, c.vocab, c.n_ctx
    b: dict[str, int] = {}
    if c.arch == "gpt2":
        untied = not c.tie_embeddings
        b["residual_rotation"] = (d - 1) * (d - 2) // 2 if untied else 0
        b["qk_gl"] = L * H * dh * dh
        b["vo_gl"] = L * H * dh * dh
        b["key_bias"] = L * H * dh
        b["value_bias"] = L * H * dh
        b["norm_scale"] = 2 * L * d + (d if untied else 0)
        b["norm_shift"] = 2 * L * d + (d if untied else 0)
        b["read_mean"] = L * (3 * H * dh + f)
        b["write_mean"] = L * (H * dh + 1 + f + 1) + n + (V if untied else 0)
        b["embedding_shift"] = d - 1 if untied else d
        b["logit_shift"] = d if untied else 0
        b["mlp_scale"] = L * f if c.activation == "relu" else 0
    elif c.arch == "llama":
        untied = not c.tie_embeddings
        b["residual_rotation"] = d * (d - 1) // 2 if untied else 0
        b["qk_rope"] = L * H * dh
        b["vo_gl"] = L * H * dh * dh
        b["norm_scale"] = 2 * L * d + (d if untied else 0)
        b["logit_shift"] = d if untied else 0
        b["mlp_scale"] = L * f
    else:  # bert: post-LN encoder, output = last hidden state
        b["residual_rotation"] = 0
        b["qk_gl"] = L * H * dh * dh
        b["vo_gl"] = L * H * dh * dh
        b["key_bias"] = L * H * dh
        b["value_bias"] = L * H * dh
        b["norm_shift"] = 2 * L * d  # β of the embedding norm and of every inner norm
        b["read_mean"] = L * (3 * H * dh + f)
        b["write_mean"] = L * (H * dh + 1 + f + 1) + V + n + c.n_types
        b["embedding_shift"] = 2 * (d - 1)
        b["mlp_scale"] = L * f if c.activation == "relu" else 0
    b = {k: v for k, v in b.items() if v}
    return Redundancy(
        total=sum(b.values()),
        breakdown=b,
        n_params=count_params(c),
        paper=paper_redundancy(L, H, dh, d),
        config=c,
    )


# ---------------------------------------------------------------------------------------------
# the referee
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NumericalRedundancy:
    """Result of :func:`numerical_redundancy`.

    ``nullity`` = number of singular values ≤ ``threshold``·σ_max; ``gap`` = (smallest counted
    non-null σ)/(largest null σ), the margin that makes the count unambiguous;
    ``singular_values`` (NumPy, descending, relative to σ_max).
    """

    nullity: int
    rank: int
    n_params: int
    n_outputs: int
    threshold: float
    gap: float
    method: str
    singular_values: Any = field(repr=False)

    def __int__(self) -> int:
        return self.nullity

    def __index__(self) -> int:
        return self.nullity


def referee_inputs(config: Any, seed: Any = 0, *, n_sequences: int | None = None, xp: Any, device: Any = None):
    """Token sequences of full length n_ctx in which every token of the vocabulary occurs (and, for
    bert, random token types), enough of them for the Jacobian to have ≥ 3× more rows than parameters.

    Returns ``(tokens, token_types)`` (``token_types`` None for decoders). Inputs that miss a token or
    a position would make its embedding row look redundant.
    """
    import numpy as np

    from .. import random as _random
    from .._backend import as_namespace

    c = as_config(config)
    xp = as_namespace(xp)
    out_dim = c.vocab if c.decoder else c.d_model
    if n_sequences is None:
        n_sequences = max(2, math.ceil(3 * count_params(c) / (c.n_ctx * out_dim)), math.ceil(2 * c.vocab / c.n_ctx))
    rng = _random.generator(seed)
    tokens = rng.integers(0, c.vocab, size=(n_sequences, c.n_ctx))
    flat = tokens.reshape(-1)
    flat[: c.vocab] = rng.permutation(c.vocab)[: min(c.vocab, flat.size)]
    tokens = flat.reshape(n_sequences, c.n_ctx)
    kw = {} if device is None else {"device": device}
    tok = xp.asarray(np.ascontiguousarray(tokens), dtype=xp.int64, **kw)
    types = None
    if not c.decoder:
        types = xp.asarray(rng.integers(0, c.n_types, size=tokens.shape), dtype=xp.int64, **kw)
    return tok, types


def _flat(params: dict[str, Array], xp: Any):
    names = list(params)
    shapes = [tuple(params[k].shape) for k in names]
    sizes = [math.prod(s) for s in shapes]
    theta = xp.concat([xp.reshape(params[k], (-1,)) for k in names])

    def unflatten(t: Array) -> dict[str, Array]:
        out, start = {}, 0
        for k, s, m in zip(names, shapes, sizes, strict=True):
            out[k] = xp.reshape(t[start : start + m], s)
            start += m
        return out

    return theta, unflatten


def _stencil(g, step: float) -> Array:
    """Fourth-order central difference (−g(2h) + 8g(h) − 8g(−h) + g(−2h))/(12h)."""
    return (8 * (g(step) - g(-step)) - (g(2 * step) - g(-2 * step))) / (12 * step)


def _jacobian(model_fn, params: dict[str, Array], xp: Any, method: str, step: float) -> Array:
    """Columns in the order of the parameters (dict order, then row-major entries)."""
    import array_api_extra as xpx

    theta, unflatten = _flat(params, xp)

    def f(t):
        return model_fn(unflatten(t))

    if method == "autodiff":
        if not _backend.has_autodiff(xp):
            raise ValueError(f"method='autodiff' needs torch or jax arrays, got the {xp.__name__} backend")
        return _backend.jacfwd(f, theta, xp)
    # where it pays (JAX), one compiled, vmapped forward over all perturbed parameter vectors (rows of theta ± h·I)
    f_rows = _backend.vmap_compiled(f, xp)
    if f_rows is not None:
        E = xp.eye(theta.shape[0], dtype=theta.dtype)
        J = _stencil(lambda h: f_rows(theta[None, :] + h * E), step)
        return xp.matrix_transpose(J)
    cols: list = []
    for name, value in params.items():
        flat = xp.reshape(value, (-1,))

        def g(h, i, name=name, flat=flat, shape=value.shape):
            moved = dict(params)
            moved[name] = xp.reshape(xpx.at(flat, i).add(h, copy=True), shape)
            return model_fn(moved)

        cols.extend(_stencil(lambda h, i=i, g=g: g(h, i), step) for i in range(flat.shape[0]))
    return xp.stack(cols, axis=1)


_DEFAULT_THRESHOLD = {"central": 1e-10, "autodiff": 1e-10}


def numerical_redundancy(
    model: Any,
    params: dict[str, Array],
    inputs: Array,
    *,
    token_types: Array | None = None,
    method: str = "auto",
    threshold: float | None = None,
    step: float = 1e-4,
) -> NumericalRedundancy:
    """Nullity of the Jacobian ∂outputs/∂parameters on ``inputs``: an assumption-free count of the
    continuous symmetries at the point ``params`` (small models only: the Jacobian is dense).

    ``method``: ``"autodiff"`` (forward-mode on torch and JAX; exact up to rounding), ``"central"``
    (fourth-order central differences (−f(2h) + 8f(h) − 8f(−h) + f(−2h))/12h with h = ``step``, on
    every backend), or ``"auto"`` (autodiff where available). A singular value counts as zero when it
    is at most ``threshold``·σ_max (default 1e-10).

    Why the threshold is safe: on the float64 test configurations the null singular values measure
    ≈ 1e-12·σ_max with central differences (truncation h⁴ ≈ 1e-16, rounding ≈ 1e-16/h) and ≈ 1e-15·σ_max
    with autodiff, while the genuine non-null ones stay above 1e-6·σ_max. The closest non-null
    directions are the norms' ε-broken near-symmetries (rescaling the residual stream), whose singular
    values scale with ε: measured ≈ 1e-7·σ_max for GPT-2 at ε = 1e-5, ≈ 6e-9 for LLaMA at ε = 1e-6,
    ≈ 3e-10 for the post-LN encoder at ε = 1e-5 but ≈ 7e-6 at ε = 1e-2. The tests therefore use the
    decoders' own ε and ε = 1e-2 for the encoder, at least a decade and a half from the threshold on
    each side; the returned ``gap`` (smallest counted non-null over largest null σ) reports the margin
    of every call. With a tiny ε (BERT's default 1e-12) those 2L + 1 (post-LN) or 1 (pre-norm)
    near-symmetries fall below any threshold and are counted too.
    """
    import numpy as np

    from .._backend import to_host

    if not isinstance(model, TransformerLM):
        model = TransformerLM(model)
    model.check_params(params)
    xp = array_namespace(*params.values())
    if method == "auto":
        method = "autodiff" if _backend.has_autodiff(xp) else "central"
    if method not in ("autodiff", "central"):
        raise ValueError(f"method must be 'auto', 'autodiff' or 'central', got {method!r}")
    thr = _DEFAULT_THRESHOLD[method] if threshold is None else float(threshold)

    def model_fn(p):
        return xp.reshape(model.apply(p, inputs, token_types), (-1,))

    J = _jacobian(model_fn, dict(params), xp, method, step)
    s = np.sort(to_host(xp.linalg.svdvals(J)))[::-1]
    n_out, n_par = J.shape
    s_full = np.concatenate([s, np.zeros(max(0, n_par - s.size))])
    rel = s_full / s_full[0]
    null = rel <= thr
    nullity = int(np.count_nonzero(null))
    rank = n_par - nullity
    largest_null = rel[rank] if nullity else 0.0
    smallest_kept = rel[rank - 1] if rank else 1.0
    gap = float(smallest_kept / largest_null) if largest_null > 0 else float("inf")
    return NumericalRedundancy(
        nullity=nullity,
        rank=rank,
        n_params=n_par,
        n_outputs=n_out,
        threshold=thr,
        gap=gap,
        method=method,
        singular_values=rel,
    )

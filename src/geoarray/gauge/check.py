"""``check``: apply a random gauge transformation and report how much the outputs and weights moved."""

from __future__ import annotations

import math
import os
from typing import Any

from .. import random as _random
from .._backend import as_namespace, backend_name
from ..models.language import TransformerLM, as_config, load_checkpoint
from .counting import numerical_redundancy, redundancy, referee_inputs
from .transforms import apply_gauge, random_gauge

__all__ = ["check", "load_model"]

# the Jacobian referee is dense (outputs × parameters): only for small models
NUMERICAL_MAX_PARAMS = 3000


def _is_path(obj: Any) -> bool:
    return isinstance(obj, os.PathLike) or (
        isinstance(obj, str) and (obj.endswith(".safetensors") or os.path.sep in obj or os.path.exists(obj))
    )


def load_model(
    config_or_checkpoint: Any, seed: Any = 0, *, xp: Any = None, dtype: Any = None, device: Any = None
) -> tuple[TransformerLM, dict[str, Any], str]:
    """``(model, params, source)``: a checkpoint path is loaded (:func:`~geoarray.models.load_checkpoint`),
    a config (dict, preset name, :class:`~geoarray.models.LanguageModelConfig`) gets random generic
    weights from ``seed``."""
    import numpy as _np

    xp = as_namespace(_np if xp is None else xp)
    if _is_path(config_or_checkpoint):
        model, params = load_checkpoint(config_or_checkpoint, xp=xp, dtype=dtype, device=device)
        return model, params, os.fspath(config_or_checkpoint)
    model = TransformerLM(as_config(config_or_checkpoint))
    return model, model.init(seed, xp=xp, dtype=dtype, device=device), "random weights"


def _norm2(xp: Any, a: Any) -> float:
    return float(xp.sum(a * a))


def check(
    config_or_checkpoint: Any,
    seed: int = 0,
    *,
    xp: Any = None,
    dtype: Any = None,
    device: Any = None,
    n_sequences: int = 2,
    seq_len: int | None = None,
    numerical: bool | None = None,
) -> dict[str, Any]:
    """Apply a random gauge element to a model and report invariance and redundancy.

    ``config_or_checkpoint``: a config dict / preset name (random generic weights from ``seed``) or a
    safetensors checkpoint path. The element (:func:`~geoarray.gauge.transforms.random_gauge`) has
    every factor the architecture allows; for tied decoders the residual rotation is applied to the
    untied copy (tied embeddings break it, see :mod:`geoarray.gauge.counting`). Outputs are
    compared on ``n_sequences`` random sequences of ``seq_len`` tokens (default min(n_ctx, 16)).

    Returns a dict with ``max_abs_output_diff``, ``max_rel_output_diff`` (relative to ``max |output|``),
    ``relative_weight_change`` (‖θ' − θ‖/‖θ‖ over the parameters both share; an untied unembedding is
    compared with Eᵀ), ``n_params``, ``redundancy`` (exact count), ``redundancy_breakdown``,
    ``paper_redundancy`` (eq. 17), ``redundancy_numerical`` (Jacobian nullity when ``numerical`` is
    True, default: when the model has ≤ 3000 parameters, else None), ``group``, ``untied``,
    ``source``, ``backend``, ``dtype``.
    """
    import numpy as _np

    xp = as_namespace(_np if xp is None else xp)
    model, params, source = load_model(config_or_checkpoint, seed, xp=xp, dtype=dtype, device=device)
    c = model.config
    kw = {} if device is None else {"device": device}
    T = min(c.n_ctx, 16) if seq_len is None else int(seq_len)
    if not 1 <= T <= c.n_ctx:
        raise ValueError(f"seq_len must be between 1 and n_ctx = {c.n_ctx}, got {seq_len}")
    s_tok, s_gauge, s_ref = _random.spawn(seed, 3)
    rng = _random.generator(s_tok)
    tokens = xp.asarray(rng.integers(0, c.vocab, size=(n_sequences, T)), dtype=xp.int64, **kw)
    types = None
    if c.arch == "bert":
        types = xp.asarray(rng.integers(0, c.n_types, size=(n_sequences, T)), dtype=xp.int64, **kw)
    first = params["embed"]
    g = random_gauge(model, s_gauge, xp=xp, dtype=first.dtype, device=device)
    model2, params2 = apply_gauge(model, params, g)
    out = model.apply(params, tokens, types)
    out2 = model2.apply(params2, tokens, types)
    diff = float(xp.max(xp.abs(out2 - out)))
    scale = float(xp.max(xp.abs(out)))
    num = den = 0.0
    for k, v in params.items():
        num += _norm2(xp, params2[k] - v)
        den += _norm2(xp, v)
    if "unembed" in params2 and "unembed" not in params:
        ref = xp.matrix_transpose(params["embed"])
        num += _norm2(xp, params2["unembed"] - ref)
        den += _norm2(xp, ref)
    r = redundancy(c)
    report: dict[str, Any] = {
        "arch": c.arch,
        "config": c.to_dict(),
        "source": source,
        "backend": backend_name(xp),
        "dtype": str(first.dtype),
        "group": g.describe(model),
        "untied": model2.config.tie_embeddings != c.tie_embeddings,
        "max_abs_output_diff": diff,
        "max_rel_output_diff": diff / scale if scale > 0 else diff,
        "relative_weight_change": math.sqrt(num / den) if den > 0 else 0.0,
        "n_params": model.n_params(),
        "redundancy": r.total,
        "redundancy_breakdown": r.breakdown,
        "paper_redundancy": r.paper,
        "redundancy_numerical": None,
    }
    if numerical is None:
        numerical = model.n_params() <= NUMERICAL_MAX_PARAMS
    if numerical:
        tok, typ = referee_inputs(c, s_ref, xp=xp, device=device)
        nr = numerical_redundancy(model, params, tok, token_types=typ)
        report["redundancy_numerical"] = nr.nullity
        report["numerical_threshold"] = nr.threshold
        report["numerical_gap"] = nr.gap
        report["numerical_method"] = nr.method
    return report

"""The configuration of a language model: architecture, sizes, activation, norms, presets."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

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

#: Named configurations (``gpt2``, ``gpt2-xl``, ``llama-65b``, ...) accepted wherever a
#: :class:`LanguageModelConfig` is: the models of van Nierop's Table 1.
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
    if isinstance(getattr(config, "config", None), LanguageModelConfig):  # a TransformerLM
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

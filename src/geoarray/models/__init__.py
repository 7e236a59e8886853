"""Architectures of the papers, each a layer-contract object (``init``, ``apply``, ``vjp``, ``manifolds``)
composed from the layers of :mod:`geoarray.nn`; and :mod:`geoarray.models.language`: GPT-2-, LLaMA- and
BERT-style transformer stacks (:class:`TransformerLM`) with safetensors loading in the Hugging Face layouts,
the reference models of :mod:`geoarray.gauge`."""

from .classification import ClassificationTransformer
from .language import (
    PRESETS,
    LanguageModelConfig,
    TransformerLM,
    as_config,
    config_from_hf,
    from_hf_state_dict,
    load_checkpoint,
    save_checkpoint,
    to_hf_state_dict,
)
from .rollout import iterate
from .standard import StandardTransformerIntegrator
from .symplectic import GSympNet, LASympNet, LinearSymplecticTransformer, SymplecticTransformer
from .volume_preserving import VolumePreservingFeedForward, VolumePreservingTransformer

__all__ = [
    "PRESETS",
    "ClassificationTransformer",
    "GSympNet",
    "LASympNet",
    "LanguageModelConfig",
    "LinearSymplecticTransformer",
    "StandardTransformerIntegrator",
    "SymplecticTransformer",
    "TransformerLM",
    "VolumePreservingFeedForward",
    "VolumePreservingTransformer",
    "as_config",
    "config_from_hf",
    "from_hf_state_dict",
    "iterate",
    "load_checkpoint",
    "save_checkpoint",
    "to_hf_state_dict",
]

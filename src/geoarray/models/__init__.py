"""Model architectures built from geoarray layers and array-API code.

:mod:`geoarray.models.language`: GPT-2-, LLaMA- and BERT-style transformer stacks
(:class:`TransformerLM`) with safetensors loading in the Hugging Face layouts; the reference models
of :mod:`geoarray.gauge`.
"""

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

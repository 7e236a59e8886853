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

One module per concept: :mod:`.config` (:class:`LanguageModelConfig`, presets), :mod:`.functions`
(activations, norms, rotary embeddings), :mod:`.model` (:class:`TransformerLM`) and :mod:`.hf`
(Hugging Face configs, state dicts and safetensors checkpoints); everything is re-exported here.
"""

from __future__ import annotations

from .config import PRESETS, LanguageModelConfig, as_config
from .functions import apply_rope, erf, layer_norm, rms_norm, rope_tables
from .hf import config_from_hf, from_hf_state_dict, load_checkpoint, save_checkpoint, to_hf_config, to_hf_state_dict
from .model import TransformerLM, count_params, param_shapes

__all__ = [
    "PRESETS",
    "LanguageModelConfig",
    "TransformerLM",
    "apply_rope",
    "as_config",
    "config_from_hf",
    "count_params",
    "erf",
    "from_hf_state_dict",
    "layer_norm",
    "load_checkpoint",
    "param_shapes",
    "rms_norm",
    "rope_tables",
    "save_checkpoint",
    "to_hf_config",
    "to_hf_state_dict",
]

"""Hugging Face layouts: configs and state dicts translated to and from geoarray's, and safetensors
checkpoints (:func:`load_checkpoint`, :func:`save_checkpoint`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ..._backend import array_namespace, as_namespace, resolve_dtype
from ..._typing import Array
from .config import LanguageModelConfig, as_config
from .model import TransformerLM

# ---------------------------------------------------------------------------------------------
# Hugging Face layouts and safetensors
# ---------------------------------------------------------------------------------------------


class _HFConfig(dict):
    """A config.json whose missing required key is a ValueError naming it (not a bare KeyError)."""

    def __missing__(self, key: str) -> Any:
        raise ValueError(f"Hugging Face config needs {key!r} (model_type {self.get('model_type')!r})")


def _head_dim(d: Any, H: Any, d_name: str, h_name: str) -> int:
    """d // H, once both are positive ints (as_config checks the result; a division by a head count of 0
    would be a ZeroDivisionError first)."""
    for value, name in ((d, d_name), (H, h_name)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Hugging Face config: {name} must be a positive int, got {value!r}")
    return d // H


def _number(value: Any) -> Any:
    """float(value) for a number; anything else unchanged, for as_config to refuse naming the key."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def config_from_hf(hf: Mapping[str, Any]) -> LanguageModelConfig:
    """A config from a Hugging Face ``config.json`` dict (model_type gpt2, bert or llama)."""
    if not isinstance(hf, Mapping):
        raise TypeError(f"a Hugging Face config must be a JSON object, got {type(hf).__name__}")
    hf = _HFConfig(hf)
    kind = hf.get("model_type")
    if kind == "gpt2":
        d, H = hf["n_embd"], hf["n_head"]
        act = hf.get("activation_function", "gelu_new")
        return as_config(
            dict(
                arch="gpt2",
                n_layers=hf["n_layer"],
                n_heads=H,
                d_head=hf.get("head_dim") or _head_dim(d, H, "n_embd", "n_head"),
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
                d_head=hf.get("head_dim") or _head_dim(d, H, "hidden_size", "num_attention_heads"),
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
                d_head=hf.get("head_dim") or _head_dim(d, H, "hidden_size", "num_attention_heads"),
                d_model=d,
                d_ff=hf["intermediate_size"],
                vocab=hf["vocab_size"],
                n_ctx=hf.get("max_position_embeddings", 2048),
                norm_eps=hf.get("rms_norm_eps", 1e-6),
                rope_theta=_number(hf.get("rope_theta", 10000.0)),
                tie_embeddings=hf.get("tie_word_embeddings", False),
            )
        )
    raise ValueError(f"config.json: model_type must be 'gpt2', 'bert' or 'llama', got {kind!r}")


def to_hf_config(config: LanguageModelConfig) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of ``config`` (the inverse of :func:`config_from_hf`)."""
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
# the format tag of geoarray.gauge's gauge-fixed files (geoarray.gauge.checkpoints.FORMAT is this one): defined
# here, below gauge, because load_checkpoint recognises such a file to say what it is
_GAUGE_FIXED_FORMAT = "geoarray-gauge-fixed-v1"


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
        from ..._install import install_hint

        raise ImportError(f"reading a safetensors checkpoint needs safetensors: {install_hint('gauge')}") from None

    st_path, cfg_path = _resolve_checkpoint_path(path)
    try:
        sd = load_file(st_path)
        with safe_open(st_path, "np") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # safetensors raises its own SafetensorError for an empty, truncated or foreign file
        raise ValueError(
            f"checkpoint {st_path!r} is damaged, truncated or not a safetensors file ({type(exc).__name__}: {exc})"
        ) from None
    if meta.get("format") == _GAUGE_FIXED_FORMAT:
        raise ValueError(
            f"checkpoint {st_path!r} is a gauge-fixed model (written by geoarray.gauge.save_fixed or `geoarray gauge "
            "fix`): it holds the reduced parameters, not a Hugging Face layout; read it with "
            "geoarray.gauge.load_fixed, or give the checkpoint it was fixed from"
        )
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
    from safetensors.numpy import save

    from ..._backend import to_host
    from ..._io import atomic_write

    c = as_config(model)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    sd = to_hf_state_dict(c, params)
    host = {k: np.ascontiguousarray(to_host(v), dtype=dtype) for k, v in sd.items()}
    # safetensors' save_file creates the file with mode 0600 whatever the umask; written here it gets the
    # permissions of any new file (0666 less the umask), as geoarray.gauge.save_fixed's, and atomically
    data = save(host, metadata={_META_KEY: json.dumps(c.to_dict())})
    atomic_write(path, lambda fh: fh.write(data))

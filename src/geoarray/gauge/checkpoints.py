"""Save and load gauge-fixed models as safetensors files.

A file holds the stored entries of every parameter (``reduced.<name>``, 1-D), the ReLU sign buffers
(``sign.<name>``) and, in the metadata, the configuration, the format tag and the saving.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .._backend import as_namespace, resolve_dtype, to_host
from ..models.language.hf import _GAUGE_FIXED_FORMAT
from .fixing import GaugeFixedLM

__all__ = ["FORMAT", "load_fixed", "save_fixed"]

FORMAT = _GAUGE_FIXED_FORMAT  # "geoarray-gauge-fixed-v1"; load_checkpoint names such a file


def save_fixed(path: Any, fixed: GaugeFixedLM, reduced: Mapping[str, Any], *, dtype: str = "float32") -> None:
    """Write a gauge-fixed model (``dtype``: ``"float32"`` or ``"float64"`` for the stored entries)."""
    import numpy as np
    from safetensors.numpy import save

    from .._io import atomic_write

    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    tensors = {f"reduced.{k}": np.ascontiguousarray(to_host(v), dtype=dtype) for k, v in reduced.items()}
    tensors.update({f"sign.{k}": np.ascontiguousarray(v, dtype=np.int8) for k, v in fixed.signs.items()})
    meta = {
        "format": FORMAT,
        "geoarray_config": json.dumps(fixed.config.to_dict()),
        "n_params": str(fixed.n_params()),
        "saving": str(fixed.saving),
        "unfixed": json.dumps(fixed.unfixed),
    }
    # safetensors' save_file creates the file with mode 0600 whatever the umask; written here it gets
    # the permissions of any new file (0666 less the umask), and atomically
    data = save(tensors, metadata=meta)
    atomic_write(path, lambda fh: fh.write(data))


def load_fixed(
    path: Any, *, xp: Any = None, dtype: Any = None, device: Any = None
) -> tuple[GaugeFixedLM, dict[str, Any]]:
    """``(fixed_model, reduced)`` from a file written by :func:`save_fixed`."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"gauge-fixed checkpoint {path!r} does not exist")
    try:
        with safe_open(path, "np") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # safetensors raises its own error type for a damaged or foreign file
        raise ValueError(f"{path!r} is not a readable safetensors file ({exc})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not a gauge-fixed geoarray checkpoint (format {meta.get('format')!r})")
    tensors = load_file(path)
    signs = {k[len("sign.") :]: v.astype(np.float64) for k, v in tensors.items() if k.startswith("sign.")}
    fixed = GaugeFixedLM(json.loads(meta["geoarray_config"]), signs)
    xp = as_namespace(np if xp is None else xp)
    dt = resolve_dtype(xp, dtype, device)
    kw = {} if device is None else {"device": device}
    reduced = {
        k[len("reduced.") :]: xp.asarray(np.ascontiguousarray(v, dtype=np.float64), dtype=dt, **kw)
        for k, v in tensors.items()
        if k.startswith("reduced.")
    }
    return fixed, reduced

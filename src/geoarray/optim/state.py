"""Checkpoints of optimizer states: written from the state's leaves, versioned, atomic, never pickled.

An optimizer state (:class:`~geoarray.optim.riemannian.RiemannianState`) is an ordinary pytree of
arrays, so a checkpoint is its leaves plus a description of its structure:

* the file is an ``.npz`` archive holding ``leaf_00000, leaf_00001, …`` (host copies, bit-exact) and
  ``__meta__``, a JSON document with the format name and version, the tree structure of the state
  (which names the transform states, e.g. ``ScaleByAdamState``, so an Adam checkpoint does not load
  into an optimizer with a learning-rate schedule), the optimizer's class when given, and every
  leaf's shape and dtype;
* :func:`save_state` writes to a temporary file in the same directory and renames it over ``path``,
  so a crash mid-save never destroys the previous checkpoint;
* :func:`load_state` never unpickles (``allow_pickle=False``), always closes the file, and raises one
  ``ValueError`` saying what is wrong: a damaged or truncated file, a file that is not a geoarray
  checkpoint, a format version it does not know, or a state of another optimizer or parameter tree.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np
import optree

from .. import _backend
from .manifold_muon import ManifoldMuonState
from .partition import PartitionState
from .riemannian import RiemannianState

#: every optimizer state the library returns (RiemannianOptimizer and the methods built on it,
#: ManifoldMuon and Muon, partition)
STATE_TYPES = (RiemannianState, ManifoldMuonState, PartitionState)

__all__ = ["FORMAT", "FORMAT_VERSION", "load_state", "save_state", "state_leaves"]

FORMAT = "geoarray-optimizer-state"
FORMAT_VERSION = 1


def state_leaves(state: Any) -> tuple[list, Any]:
    """The arrays of a state and the tree structure to rebuild it (``optree.tree_flatten``)."""
    return optree.tree_flatten(state)


def _dtype_name(x: Any) -> str:
    return _backend.dtype_name(x.dtype)


def _meta(state: Any, leaves: list, treedef: Any, optimizer: Any) -> dict:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "structure": str(treedef),
        "optimizer": None if optimizer is None else type(optimizer).__name__,
        "shapes": [list(x.shape) for x in leaves],
        "dtypes": [_dtype_name(x) for x in leaves],
    }


def _check_state(state: Any, name: str) -> None:
    if not isinstance(state, STATE_TYPES):
        raise TypeError(
            f"{name} must be an optimizer state returned by opt.init or opt.update "
            f"({', '.join(t.__name__ for t in STATE_TYPES)}), got {type(state).__name__}"
        )


def save_state(path: str | os.PathLike, state: RiemannianState, *, optimizer: Any = None) -> None:
    """Write ``state`` to ``path`` (an ``.npz`` archive), bit-exactly and atomically.

    The arrays are copied to the host (NumPy) to be written. Give ``optimizer`` to record its class,
    which :func:`load_state` then checks.
    """
    _check_state(state, "state")
    leaves, treedef = state_leaves(state)
    arrays = {f"leaf_{i:05d}": _backend.to_host(leaf) for i, leaf in enumerate(leaves)}
    arrays["__meta__"] = np.array(json.dumps(_meta(state, leaves, treedef, optimizer)))
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read(path: str) -> tuple[dict, list]:
    """The metadata and host arrays of a checkpoint; ValueError for anything unreadable."""
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
            if "__meta__" not in data.files:
                raise ValueError(f"{path!r} is not a geoarray optimizer checkpoint (no __meta__ record)")
            meta = json.loads(str(data["__meta__"]))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise ValueError(f"{path!r} is not a geoarray optimizer checkpoint (format {meta!r:.80})")
            if meta.get("version") != FORMAT_VERSION:
                raise ValueError(
                    f"{path!r} is a geoarray checkpoint of format version {meta.get('version')!r}; this geoarray reads "
                    f"version {FORMAT_VERSION}"
                )
            n = len(meta.get("shapes", []))
            host = [data[f"leaf_{i:05d}"] for i in range(n)]
    except ValueError as exc:
        if str(exc).startswith(repr(path)):
            raise
        raise ValueError(f"{path!r} is damaged or not a geoarray optimizer checkpoint ({exc})") from None
    except (zipfile.BadZipFile, EOFError, KeyError, OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(
            f"{path!r} is damaged or truncated, or not a geoarray optimizer checkpoint ({type(exc).__name__}: {exc})"
        ) from None
    return meta, host


def load_state(path: str | os.PathLike, like: RiemannianState, *, optimizer: Any = None) -> RiemannianState:
    """Read a state written by :func:`save_state`, on the namespace, dtypes and devices of ``like``.

    ``like`` is a state of the same optimizer for the same parameters (e.g. from ``opt.init``); its
    leaves give the expected structure, shapes, dtypes and devices. Any mismatch raises
    ``ValueError`` naming it, and nothing is returned half-loaded.
    """
    _check_state(like, "like")
    path = os.fspath(path)
    meta, host = _read(path)
    leaves, treedef = state_leaves(like)
    if optimizer is not None and meta.get("optimizer") not in (None, type(optimizer).__name__):
        raise ValueError(
            f"{path!r} holds the state of a {meta['optimizer']} optimizer, not of {type(optimizer).__name__}"
        )
    if meta.get("structure") != str(treedef):
        raise ValueError(
            f"{path!r} holds the state of another optimizer or parameter tree:\n  file: {meta.get('structure')}\n"
            f"  like: {treedef}"
        )
    if len(host) != len(leaves):
        raise ValueError(f"{path!r} has {len(host)} arrays, like has {len(leaves)}")
    out = []
    for i, (h, ref) in enumerate(zip(host, leaves, strict=True)):
        if tuple(h.shape) != tuple(ref.shape):
            raise ValueError(f"array {i} of {path!r} has shape {h.shape}, like has {tuple(ref.shape)}")
        if h.dtype.name != _dtype_name(ref):
            raise ValueError(f"array {i} of {path!r} has dtype {h.dtype.name}, like has {ref.dtype}")
    for h, ref in zip(host, leaves, strict=True):
        out.append(_backend.from_host_like(h, ref))  # like's memory layout: bit-exact resume on torch
    return optree.tree_unflatten(treedef, out)

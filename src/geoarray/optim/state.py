"""Checkpoints of optimizer states: written from the state's leaves, versioned, atomic, never pickled.

An optimizer state (:class:`~geoarray.optim.riemannian.RiemannianState`) is an ordinary pytree of
arrays, so a checkpoint is its leaves plus a description of its structure:

* the file is an ``.npz`` archive holding ``leaf_00000, leaf_00001, …`` (host copies, bit-exact) and
  ``__meta__``, a JSON document with the format name and version, the tree structure of the state
  (which names the transform states, e.g. ``ScaleByAdamState``, so an Adam checkpoint does not load
  into an optimizer with a learning-rate schedule), the optimizer's class when given, and every
  leaf's shape and dtype;
* :func:`save_state` writes to a temporary file in the same directory, fsyncs it and renames it over
  ``path`` (:mod:`geoarray._io`), so a crash mid-save never destroys the previous checkpoint;
* :func:`load_state` never unpickles, checks every array header before reading it (no object arrays,
  no declared shape larger than the bytes present), always closes the file, and raises one
  ``ValueError`` saying what is wrong: a damaged or truncated file, a file that is not a geoarray
  checkpoint, a format version it does not know, or a state of another optimizer or parameter tree.
"""

from __future__ import annotations

import os
from typing import Any

import optree

from .. import _io
from .inject import InjectHyperparamsState
from .manifold_muon import ManifoldMuonState
from .partition import PartitionState
from .riemannian import RiemannianState

#: every optimizer state the library returns (RiemannianOptimizer and the methods built on it,
#: ManifoldMuon and Muon, partition, inject_hyperparams)
STATE_TYPES = (RiemannianState, ManifoldMuonState, PartitionState, InjectHyperparamsState)

__all__ = ["FORMAT", "FORMAT_VERSION", "STATE_TYPES", "load_state", "save_state", "state_arrays", "state_leaves"]

FORMAT = "geoarray-optimizer-state"
FORMAT_VERSION = 1


def state_leaves(state: Any) -> tuple[list, Any]:
    """The arrays of a state and the tree structure to rebuild it (``optree.tree_flatten``)."""
    return optree.tree_flatten(state)


def _check_state(state: Any, name: str) -> None:
    if not isinstance(state, STATE_TYPES):
        raise TypeError(
            f"{name} must be an optimizer state returned by opt.init or opt.update "
            f"({', '.join(t.__name__ for t in STATE_TYPES)}), got {type(state).__name__}"
        )


def save_state(path: str | os.PathLike, state: RiemannianState, *, optimizer: Any = None) -> None:
    """Write ``state`` to ``path`` (an ``.npz`` archive), bit-exactly, atomically and durably.

    The arrays are copied to the host (NumPy) to be written (:func:`geoarray._io.tree_arrays`), the file
    is written beside ``path``, fsync-ed and renamed over it (:func:`geoarray._io.atomic_write`). Give
    ``optimizer`` to record its class, which :func:`load_state` then checks.
    """
    arrays = state_arrays(state, optimizer=optimizer)
    _io.atomic_write(path, lambda fh: _io.write_npz(fh, arrays))


def state_arrays(state: RiemannianState, *, optimizer: Any = None) -> dict:
    """The ``.npz`` members :func:`save_state` writes (host copies of the leaves and ``__meta__``)."""
    _check_state(state, "state")
    header = {"format": FORMAT, "version": FORMAT_VERSION}
    header["optimizer"] = None if optimizer is None else type(optimizer).__name__
    return _io.tree_arrays(state, header, what="optimizer state")


def load_state(
    path: str | os.PathLike, like: RiemannianState, *, optimizer: Any = None, data: bytes | None = None
) -> RiemannianState:
    """Read a state written by :func:`save_state`, on the namespace, dtypes and devices of ``like``.

    ``like`` is a state of the same optimizer for the same parameters (e.g. from ``opt.init``); its
    leaves give the expected structure, shapes, dtypes and devices. Any mismatch raises
    ``ValueError`` naming it, and nothing is returned half-loaded. ``data`` (the file's bytes, already
    read and verified by the caller, as :func:`geoarray.train.load_checkpoint` does) replaces reading
    ``path``, which then only names the file in messages.
    """
    _check_state(like, "like")
    path = os.fspath(path)
    state, meta = _io.read_tree(
        path, like, fmt=FORMAT, versions=(FORMAT_VERSION,), what="geoarray optimizer checkpoint", data=data
    )
    if optimizer is not None and meta.get("optimizer") not in (None, type(optimizer).__name__):
        raise ValueError(
            f"{path!r} holds the state of a {meta['optimizer']} optimizer, not of {type(optimizer).__name__}"
        )
    return state

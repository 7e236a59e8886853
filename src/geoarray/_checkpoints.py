"""Training checkpoints committed as one unit (public through :mod:`geoarray.train`).

A checkpoint directory ``DIR`` holds one subdirectory per checkpoint, ``DIR/ckpt-000000042`` (the
optimizer step), each holding

* ``params.npz`` — the parameter leaves (host copies, bit-exact, with the tree structure);
* ``opt_state.npz`` — the optimizer state, as :func:`geoarray.optim.save_state` writes it;
* ``meta.json`` — what the training loop needs to resume (epoch, batch, step, seed, history, …);
* ``manifest.json`` — the format, the step, and every other file's size and SHA-256.

Commit protocol (orbax's, with SQLite's durability rules): the files are written into a temporary
directory ``DIR/.tmp-ckpt-…`` and each is fsync-ed, the manifest last; the temporary directory is
fsync-ed and renamed to its final name in one ``rename``, and ``DIR`` is fsync-ed. A process killed at
any point leaves either no ``ckpt-…`` directory for that step or a complete one; temporary leftovers
of dead processes are removed by the next save. Only the ``keep`` newest checkpoints are kept (an
older one is renamed away, then deleted).

:func:`load_checkpoint` reads the manifest, checks every file's size and SHA-256 against it (so files
of different saves, a truncated file or a flipped bit are refused) and parses exactly the bytes it
checked. Given ``DIR`` it takes the newest checkpoint; with ``fallback=True`` (what
``fit(resume=True)`` uses) it skips damaged ones, with a warning naming each, down to the newest
intact one.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _io

__all__ = ["latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint"]

FORMAT = "geoarray-checkpoint"
FORMAT_VERSION = 1
PARAMS_FORMAT = "geoarray-params"
MANIFEST = "manifest.json"
FILES = ("params.npz", "opt_state.npz", "meta.json")
_NAME = re.compile(r"^ckpt-(\d{9,})$")
_LEFTOVER = re.compile(r"^\.(?:tmp|del)-ckpt-\d+-(\d+)-[0-9a-f]+$")


def _name(step: int) -> str:
    return f"ckpt-{step:09d}"


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, str]]:
    """``[(step, path), …]`` of the committed checkpoints in ``directory``, oldest first ([] if none)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    found = []
    for entry in os.listdir(directory):
        m = _NAME.match(entry)
        if m and os.path.isdir(os.path.join(directory, entry)):
            found.append((int(m.group(1)), os.path.join(directory, entry)))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike) -> str | None:
    """The path of the newest committed checkpoint in ``directory`` (not verified), or None."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def _alive(pid: int) -> bool:
    """Whether another process with this id runs (this process's own leftovers are of failed saves)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: a process of another user holds that id
        return True
    return True


def _remove_leftovers(directory: str) -> None:
    """Temporary and half-deleted checkpoint directories of failed saves (of this process, or of processes
    that no longer run; one directory is written by one run at a time)."""
    for entry in os.listdir(directory):
        m = _LEFTOVER.match(entry)
        if m and not _alive(int(m.group(1))):
            _io.fs.rmtree(os.path.join(directory, entry))


def _write_file(path: str, data: bytes) -> None:
    with _io.fs.open_write(path) as fh:
        fh.write(data)
        _io.fs.fsync(fh)


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    _io.write_npz(buf, arrays)
    return buf.getvalue()


def _os_error(exc: OSError, directory: str, previous: str | None) -> OSError:
    kept = f"the previous checkpoint {previous!r} is intact" if previous else "no earlier checkpoint exists"
    return _io._os_error(exc, f"could not save a checkpoint into {directory!r}", kept, directory)


def save_checkpoint(
    path: str | os.PathLike,
    params: Any,
    opt_state: Any,
    meta: Mapping[str, Any] | None = None,
    *,
    step: int | None = None,
    keep: int | None = None,
) -> str:
    """Commit ``params``, ``opt_state`` and ``meta`` as the checkpoint ``path/ckpt-<step>`` in one rename.

    ``step`` names the checkpoint (default: one more than the newest in ``path``, or 0); an existing
    checkpoint of that step raises ``ValueError``. ``keep`` (a positive int) deletes all but the ``keep``
    newest checkpoints afterwards. ``meta`` must be JSON-serialisable. A failing file system raises an
    ``OSError`` of the same errno naming ``path`` and the checkpoint left intact; nothing of the failed
    save remains. Returns the committed checkpoint's directory.
    """
    from .optim.state import state_arrays

    directory = os.fspath(path)
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 1):
        raise ValueError(f"save_checkpoint: keep must be a positive int or None, got {keep!r}")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(
            errno.ENOTDIR, f"checkpoint path {directory!r} is a file, not a directory; choose a directory", directory
        )
    existing = list_checkpoints(directory)
    previous = existing[-1][1] if existing else None
    if step is None:
        step = existing[-1][0] + 1 if existing else 0
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"save_checkpoint: step must be a non-negative int, got {step!r}")
    step = int(step)
    final = os.path.join(directory, _name(step))
    if os.path.lexists(final):
        raise ValueError(f"save_checkpoint: {final!r} already exists; give another step or another directory")
    # everything that can fail without touching the disk first: serialisation of the trees and the meta
    payload = {
        "params.npz": _npz_bytes(
            _io.tree_arrays(params, {"format": PARAMS_FORMAT, "version": FORMAT_VERSION}, what="parameters")
        ),
        "opt_state.npz": _npz_bytes(state_arrays(opt_state)),
        "meta.json": _io._json_bytes(dict(meta or {})),
    }
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "step": step,
        "files": {k: {"bytes": len(v), "sha256": hashlib.sha256(v).hexdigest()} for k, v in payload.items()},
    }
    tmp = os.path.join(directory, f".tmp-{_name(step)}-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        _io.fs.makedirs(directory)
        _remove_leftovers(directory)
        _io.fs.mkdir(tmp)
        for name, data in payload.items():
            _write_file(os.path.join(tmp, name), data)
        _write_file(os.path.join(tmp, MANIFEST), _io._json_bytes(manifest))
        _io.fs.fsync_dir(tmp)
        _io.fs.replace(tmp, final)  # the commit
    except BaseException as exc:
        if os.path.lexists(tmp):
            _io.FileSystem().rmtree(tmp)  # never through an injected fault: cleanup must run
        if isinstance(exc, OSError):
            raise _os_error(exc, directory, previous) from exc
        raise
    try:
        _io.fs.fsync_dir(directory)
        if keep is not None:
            for _, old in list_checkpoints(directory)[:-keep]:
                trash = os.path.join(directory, f".del-{os.path.basename(old)}-{os.getpid()}-{os.urandom(4).hex()}")
                _io.fs.replace(old, trash)
                _io.fs.rmtree(trash)
    except OSError as exc:
        raise _os_error(exc, directory, final) from exc
    return final


class LayoutError(ValueError):
    """An intact checkpoint whose trees do not fit ``like_params`` / ``like_state``: it was written by
    another model or optimizer. Not damage, so a fallback to an older checkpoint (of the same run, so of
    the same layout) would not help."""


def _verified(path: str) -> tuple[dict[str, bytes], dict]:
    """The files of the checkpoint ``path`` checked against its manifest, and its meta.json; damage
    raises ``ValueError`` naming the file. Nothing here needs the trees, so the command line checks a
    checkpoint before it builds a model."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise ValueError(f"{path!r} is not a committed geoarray checkpoint (no {MANIFEST})")
    manifest = _io.read_json(mpath, what="geoarray checkpoint manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{mpath!r} is not a geoarray checkpoint manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{mpath!r} is of format version {manifest.get('version')!r}; this geoarray reads {FORMAT_VERSION}"
        )
    m = _NAME.match(os.path.basename(os.path.normpath(path)))
    if m and manifest.get("step") != int(m.group(1)):
        raise ValueError(f"{mpath!r} names step {manifest.get('step')!r}, its directory another")
    files = manifest.get("files")
    if not isinstance(files, dict) or sorted(files) != sorted(FILES):
        raise ValueError(f"{mpath!r} lists {sorted(files) if isinstance(files, dict) else files!r}, not {list(FILES)}")
    data = {}
    for name in FILES:
        fpath = os.path.join(path, name)
        entry = files[name]
        try:
            with open(fpath, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            raise ValueError(f"checkpoint {path!r} is torn: {name} is missing") from None
        digest = hashlib.sha256(raw).hexdigest()
        if not isinstance(entry, dict) or len(raw) != entry.get("bytes") or digest != entry.get("sha256"):
            raise ValueError(
                f"checkpoint {path!r} is damaged: {name} does not match its manifest (size or SHA-256); "
                "its files do not belong together"
            )
        data[name] = raw
    meta = _io.read_json(os.path.join(path, "meta.json"), what="checkpoint meta.json", data=data["meta.json"])
    if not isinstance(meta, dict):
        raise ValueError(f"{os.path.join(path, 'meta.json')!r} holds a {type(meta).__name__}, not an object")
    return data, meta


def _load_one(path: str, like_params: Any, like_state: Any) -> tuple[Any, Any, dict]:
    from .optim.state import load_state

    data, meta = _verified(path)
    # the bytes are the ones that were saved (checked above): a tree that does not fit was written by
    # another model or optimizer; its first line names the mismatch (the rest would be two tree dumps)
    try:
        params, _ = _io.read_tree(
            os.path.join(path, "params.npz"),
            like_params,
            fmt=PARAMS_FORMAT,
            versions=(FORMAT_VERSION,),
            what="geoarray parameter file",
            data=data["params.npz"],
        )
    except ValueError as exc:
        raise LayoutError(
            f"checkpoint {path!r} is intact but holds the parameters of another model than like_params "
            f"({_first_line(exc)}); load it with the model that wrote it"
        ) from None
    try:
        opt_state = load_state(os.path.join(path, "opt_state.npz"), like_state, data=data["opt_state.npz"])
    except ValueError as exc:
        raise LayoutError(
            f"checkpoint {path!r} is intact but holds the state of another optimizer than like_state "
            f"({_first_line(exc)}); load it with the optimizer that wrote it"
        ) from None
    return params, opt_state, meta


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__


def newest_intact(directory: str | os.PathLike) -> tuple[str | None, dict, list[tuple[str, str]]]:
    """``(path, meta, damaged)``: the newest checkpoint of ``directory`` whose files match its manifest,
    its meta.json, and ``(path, reason)`` of each newer damaged one; ``(None, {}, damaged)`` when none
    is intact. The trees are not read (see :func:`_verified`)."""
    damaged: list[tuple[str, str]] = []
    for _, ckpt in reversed(list_checkpoints(directory)):
        try:
            return ckpt, _verified(ckpt)[1], damaged
        except ValueError as exc:
            damaged.append((ckpt, str(exc)))
    return None, {}, damaged


def _load(path: Any, like_params: Any, like_state: Any, fallback: bool) -> tuple[Any, Any, dict, str]:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "load_checkpoint: no such checkpoint or directory", path)
    if not os.path.isdir(path):
        raise ValueError(f"load_checkpoint: {path!r} is a file; give a checkpoint directory")
    if os.path.exists(os.path.join(path, MANIFEST)) or _NAME.match(os.path.basename(os.path.normpath(path))):
        return (*_load_one(path, like_params, like_state), path)
    found = list_checkpoints(path)
    if not found:
        if os.path.exists(os.path.join(path, "params.npz")):
            raise ValueError(
                f"load_checkpoint: {path!r} holds a checkpoint of an older geoarray (separate files without a "
                "manifest), which cannot be verified; load its files with geoarray.optim.load_state"
            )
        raise ValueError(f"load_checkpoint: {path!r} holds no checkpoint (ckpt-<step> directories)")
    reasons = []
    for _, ckpt in reversed(found):
        try:
            return (*_load_one(ckpt, like_params, like_state), ckpt)
        except LayoutError:
            raise  # the run's older checkpoints have the same layout: skipping to them would not help
        except ValueError as exc:
            if not fallback:
                raise ValueError(f"{exc}; pass fallback=True to load the newest intact checkpoint instead") from None
            warnings.warn(f"skipping a damaged checkpoint: {exc}", RuntimeWarning, stacklevel=3)
            reasons.append(str(exc))
    raise ValueError(f"load_checkpoint: no intact checkpoint in {path!r}:\n  " + "\n  ".join(reasons))


def load_checkpoint(
    path: str | os.PathLike, *, like_params: Any, like_state: Any, fallback: bool = False
) -> tuple[Any, Any, dict]:
    """``(params, opt_state, meta)`` of a checkpoint written by :func:`save_checkpoint`.

    ``path`` is one checkpoint (``DIR/ckpt-…``) or a checkpoint directory ``DIR``, whose newest
    checkpoint is taken; with ``fallback=True`` damaged ones are skipped (with a ``RuntimeWarning``)
    down to the newest intact one. Every file is checked against the manifest's size and SHA-256
    before it is parsed. The arrays are placed on the namespace, dtypes, devices and memory layout of
    ``like_params`` / ``like_state`` (e.g. ``model.init(...)`` and ``optimizer.init(...)``). A damaged,
    torn or foreign checkpoint, or one of another layout, raises ``ValueError`` naming the file; another
    layout is not damage, so ``fallback`` does not skip it (the run's older checkpoints share it).
    """
    params, opt_state, meta, _ = _load(path, like_params, like_state, bool(fallback))
    return params, opt_state, meta

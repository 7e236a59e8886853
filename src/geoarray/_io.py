"""File I/O of the package in one place: durable atomic writes, JSON, and pytrees of arrays in ``.npz``.

Durability follows the rule that POSIX file systems need (the protocol of SQLite's journal and of
orbax's checkpoint commit): data reaches a temporary file in the same directory, is flushed and
``fsync``-ed, the file is renamed over its final name (``os.replace``, atomic on one file system), and the
directory is ``fsync``-ed so that the rename itself survives a power loss. Readers then see either the
old file or the new one, never a mixture.

Every file-system call of a save goes through :data:`fs`, one small object, so a test can fail or kill
the process at each of them (as SQLite's crash tests do through a VFS shim).

Reading never unpickles and never trusts what a file declares: :func:`read_npz` checks every member's
``.npy`` header (no object dtypes, a non-negative shape, and exactly as many data bytes as the shape
needs) before allocating anything, so a tiny malicious file cannot ask for gigabytes, and any damage
(truncation, bit flips caught by the zip CRC, bad JSON) becomes one ``ValueError`` naming the file.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO, cast

import numpy as np

__all__ = [
    "FileSystem",
    "atomic_write",
    "fs",
    "fsync_dir",
    "read_json",
    "read_npz",
    "read_tree",
    "tree_arrays",
    "write_json",
    "write_npz",
]

# deflate cannot expand beyond ~1032:1; a member claiming more is a zip bomb or damage
_MAX_DEFLATE_RATIO = 1100


class FileSystem:
    """The file-system calls of every save; a test replaces :data:`fs` to inject faults or kills."""

    def open_write(self, path: str) -> BinaryIO:
        return open(path, "xb")

    def fsync(self, fh: BinaryIO) -> None:
        fh.flush()
        os.fsync(fh.fileno())

    def fsync_dir(self, path: str) -> None:
        fsync_dir(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)


fs = FileSystem()


def fsync_dir(path: str) -> None:
    """``fsync`` a directory so that renames into it are durable; a no-op where the platform cannot
    (Windows opens no directory descriptors; its renames are journaled by NTFS)."""
    if os.name == "nt" or not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> str:
    """Write a file durably and atomically: ``write(fh)`` fills a temporary file in the same directory,
    which is flushed, fsync-ed and renamed over ``path``; then the directory is fsync-ed.

    On any failure the temporary file is removed and ``path`` is left as it was. Returns ``path``.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.urandom(4).hex()}-{os.path.basename(path)}")
    try:
        with fs.open_write(tmp) as fh:
            write(fh)
            fs.fsync(fh)
        fs.replace(tmp, path)
    except BaseException as exc:
        if os.path.lexists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError):
            raise _os_error(exc, f"could not write {path!r}", f"{path!r} is left as it was", path) from exc
        raise
    try:
        fs.fsync_dir(directory)
    except OSError as exc:
        raise _os_error(exc, f"could not make the new {path!r} durable", "its content is whole", path) from exc
    return path


def _os_error(exc: OSError, doing: str, kept: str, path: str) -> OSError:
    """An ``OSError`` of the same errno (so ``PermissionError`` stays one) saying what failed, the
    file-system call's own path, and what is intact."""
    where = f" ({exc.filename})" if exc.filename else ""
    message = f"{doing}: {exc.strerror or exc}{where}; {kept}"
    if exc.errno is None:  # an OSError raised without an errno (by a library or a test)
        return type(exc)(message)
    new = OSError(exc.errno, message)
    new.filename = path
    return new


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


def write_json(path: str | os.PathLike, obj: Any, *, atomic: bool = True) -> str:
    """``obj`` as indented JSON (floats written by ``repr``, so they read back bit-exactly), parent
    directories created; atomic and durable unless ``atomic=False``. Returns the path."""
    path = os.fspath(path)
    data = _json_bytes(obj)
    parent = os.path.dirname(path)
    if parent:
        fs.makedirs(parent)
    if atomic:
        return atomic_write(path, lambda fh: fh.write(data))
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def read_json(path: str | os.PathLike, *, what: str = "JSON file", data: bytes | None = None) -> Any:
    """The JSON document in ``path`` (or in ``data``, the bytes read from it); ``ValueError`` naming the
    file if it is not valid UTF-8 JSON. A missing file raises ``FileNotFoundError``."""
    path = os.fspath(path)
    try:
        if data is None:
            with open(path, "rb") as fh:
                data = fh.read()
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path!r} is damaged or not a {what} ({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------------------------------------
# arrays in .npz archives
# ---------------------------------------------------------------------------------------------


def write_npz(fh: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """``numpy.savez`` into an open binary file (uncompressed members, as NumPy writes them)."""
    for name, a in arrays.items():
        if a.dtype.hasobject:
            raise TypeError(f"array {name!r} has dtype {a.dtype}, which cannot be saved without pickle")
    # the stub fears a member named like savez's own allow_pickle: bool; the members are tree_arrays'
    # leaf_NNNNN and __meta__
    np.savez(fh, **cast("dict[str, Any]", arrays))


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ValueError(f"member {info.filename!r} uses an unsupported compression ({info.compress_type})")
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > _MAX_DEFLATE_RATIO * max(info.compress_size, 1):
        raise ValueError(f"member {info.filename!r} declares {info.file_size} bytes from {info.compress_size}")
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"member {info.filename!r} has .npy version {version}")
        if dtype.hasobject:
            raise ValueError(f"member {info.filename!r} holds objects (dtype {dtype}), which are never unpickled")
        if any(d < 0 for d in shape):
            raise ValueError(f"member {info.filename!r} declares the shape {shape}")
        nbytes = math.prod(shape) * dtype.itemsize
        available = info.file_size - f.tell()
        if nbytes != available:
            raise ValueError(
                f"member {info.filename!r} declares {shape} {dtype} ({nbytes} bytes) but holds {available} bytes"
            )
        raw = f.read(nbytes)
        if len(raw) != nbytes:
            raise ValueError(f"member {info.filename!r} is truncated")
        f.read()  # to the end of the member: zipfile checks its CRC there
    flat = np.frombuffer(raw, dtype=dtype, count=math.prod(shape))
    return flat.reshape(shape, order="F" if fortran else "C").copy()


_NPY_NAME = re.compile(r"^[A-Za-z0-9_]+\.npy$")


def read_npz(path: str | os.PathLike, *, what: str = "geoarray file", data: bytes | None = None) -> dict[str, Any]:
    """The arrays of an ``.npz`` archive (from ``path``, or from ``data``, the bytes read from it), every
    member checked before it is read (see the module docstring). Any damage raises one ``ValueError``
    naming the file; a missing file raises ``FileNotFoundError``."""
    path = os.fspath(path)
    try:
        if data is None:
            with open(path, "rb") as fh:
                data = fh.read()
        out: dict[str, Any] = {}
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                if not _NPY_NAME.match(info.filename):
                    raise ValueError(f"unexpected member {info.filename!r}")
                name = info.filename[:-4]
                if name in out:
                    raise ValueError(f"member {info.filename!r} appears twice")
                out[name] = _read_member(zf, info)
        return out
    except FileNotFoundError:
        raise
    except (ValueError, TypeError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, KeyError,
            OverflowError, MemoryError, SyntaxError, NotImplementedError, UnicodeDecodeError) as exc:  # fmt: skip
        raise ValueError(f"{path!r} is damaged or truncated, or not a {what} ({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------------------------------------
# pytrees of arrays
# ---------------------------------------------------------------------------------------------

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def tree_structure(treedef: Any) -> str:
    """The tree structure as text (class and field names of every node), without memory addresses."""
    return _ADDRESS.sub("", str(treedef))


def _host(leaf: Any, i: int, what: str) -> np.ndarray:
    from . import _backend

    if isinstance(leaf, (bool, int, float, complex, np.generic)):
        return np.asarray(leaf).copy()
    try:
        return _backend.to_host(leaf)
    except TypeError:
        raise TypeError(f"leaf {i} of the {what} is a {type(leaf).__name__}, not an array") from None


def tree_arrays(tree: Any, header: dict[str, Any], *, what: str) -> dict[str, np.ndarray]:
    """The ``.npz`` members of a pytree: host copies ``leaf_00000, …`` (bit-exact) and ``__meta__``, the
    JSON ``header`` plus the tree structure and every leaf's shape and dtype."""
    import optree

    leaves, treedef = optree.tree_flatten(tree)
    host = [_host(leaf, i, what) for i, leaf in enumerate(leaves)]
    meta = dict(header)
    meta["structure"] = tree_structure(treedef)
    meta["shapes"] = [list(h.shape) for h in host]
    meta["dtypes"] = [h.dtype.name for h in host]
    arrays = {f"leaf_{i:05d}": h for i, h in enumerate(host)}
    arrays["__meta__"] = np.array(json.dumps(meta))
    return arrays


def read_tree(
    path: str | os.PathLike,
    like: Any,
    *,
    fmt: str,
    versions: tuple[int, ...],
    what: str,
    data: bytes | None = None,
) -> tuple[Any, dict[str, Any]]:
    """``(tree, meta)`` from a file written from :func:`tree_arrays`, in the structure, namespace, dtypes,
    devices and memory layout of ``like``. ``fmt`` and ``versions`` are the accepted format name and
    versions. Any mismatch or damage raises one ``ValueError`` naming the file; nothing is half-loaded."""
    import optree

    from . import _backend

    path = os.fspath(path)
    arrays = read_npz(path, what=what, data=data)
    if "__meta__" not in arrays:
        raise ValueError(f"{path!r} is not a {what} (no __meta__ record)")
    raw = arrays["__meta__"]
    if raw.shape != () or raw.dtype.kind != "U":
        raise ValueError(f"{path!r} is damaged or not a {what} (__meta__ is {raw.dtype} of shape {raw.shape})")
    meta = read_json(path, what=what, data=str(raw).encode("utf-8"))
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"{path!r} is not a {what} (format {found!r:.80}, expected {fmt!r})")
    if meta.get("version") not in versions:
        raise ValueError(
            f"{path!r} is a {what} of format version {meta.get('version')!r}; this geoarray reads version "
            f"{', '.join(map(str, versions))}"
        )
    leaves, treedef = optree.tree_flatten(like)
    if _ADDRESS.sub("", str(meta.get("structure"))) != tree_structure(treedef):
        raise ValueError(
            f"{path!r} holds a {what} of another structure (another optimizer or parameter tree):\n"
            f"  file: {meta.get('structure')}\n  like: {tree_structure(treedef)}"
        )
    names = [f"leaf_{i:05d}" for i in range(len(leaves))]
    if sorted(arrays) != sorted([*names, "__meta__"]):
        raise ValueError(f"{path!r} has {len(arrays) - 1} arrays, like has {len(leaves)}")
    out = []
    for i, (name, ref) in enumerate(zip(names, leaves, strict=True)):
        h = arrays[name]
        ref_host_dtype = np.asarray(ref).dtype if isinstance(ref, (bool, int, float, complex)) else None
        ref_dtype = ref_host_dtype.name if ref_host_dtype is not None else _backend.dtype_name(ref.dtype)
        ref_shape = () if ref_host_dtype is not None else tuple(ref.shape)
        if tuple(h.shape) != ref_shape:
            raise ValueError(f"array {i} of {path!r} has shape {h.shape}, like has {ref_shape}")
        if h.dtype.name != ref_dtype:
            raise ValueError(f"array {i} of {path!r} has dtype {h.dtype.name}, like has {ref_dtype}")
    for name, ref in zip(names, leaves, strict=True):
        h = arrays[name]
        if isinstance(ref, (bool, int, float, complex)):
            out.append(type(ref)(h.item()))
        else:  # like's memory layout: on torch a column-major tensor restored row-major rounds differently
            out.append(_backend.from_host_like(h, ref))
    return optree.tree_unflatten(treedef, out), meta

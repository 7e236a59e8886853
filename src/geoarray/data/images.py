"""Image data for the vision transformer: digits, MNIST IDX files, patches, one-hot labels, splits.

* :func:`load_digits` — scikit-learn's bundled 8×8 handwritten digits (1797 images, offline).
* :func:`read_idx` / :func:`load_mnist` — MNIST from IDX files in a local directory (never downloaded).
* :func:`patches` / :func:`unpatch` — an image cut into a sequence of flattened square patches, as in
  fig. 2 of Brantner, "Generalizing Adam to manifolds for efficiently training transformers".
* :func:`one_hot`, :func:`train_test_split`.

Loaders read on the host and move the result once to the requested namespace, dtype and device;
:func:`patches`, :func:`unpatch`, :func:`one_hot` and :func:`train_test_split` are array-API code
that keeps the namespace and device of their input.
"""

from __future__ import annotations

import gzip
import math
import os
from typing import Any

import numpy as np

from .. import _backend

__all__ = ["load_digits", "load_mnist", "one_hot", "patches", "read_idx", "train_test_split", "unpatch"]

from .._typing import Array

# IDX type codes (third magic byte) → big-endian NumPy dtypes
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _to_xp(host: np.ndarray, xp: Any, dtype: Any, device: Any) -> Array:
    xp = _backend.as_namespace(np if xp is None else xp)
    if dtype is None and np.issubdtype(host.dtype, np.integer):
        dt = None
    else:
        dt = _backend.resolve_dtype(xp, dtype, device)
    kwargs = {} if device is None else {"device": device}
    if dt is None:
        return xp.asarray(np.ascontiguousarray(host.astype(np.int64)), **kwargs)
    return xp.asarray(np.ascontiguousarray(host), dtype=dt, **kwargs)


def load_digits(*, xp: Any = None, dtype: Any = None, device: Any = None) -> tuple[Array, Array]:
    """``(images, labels)``: scikit-learn's 1797 digits as (1797, 8, 8) floats in [0, 1] and int64 labels 0–9.

    The pixel values 0…16 are divided by 16. ``xp`` defaults to NumPy, ``dtype`` to the backend's
    default float (float64 where available). Needs scikit-learn (the ``demo`` extra); the data ship
    with it, so nothing is downloaded.
    """
    try:
        from sklearn.datasets import load_digits as _sk_load_digits
    except ImportError:
        from .._install import install_hint

        raise ImportError(f"load_digits needs scikit-learn: {install_hint('demo')}") from None
    bunch = _sk_load_digits()
    images = np.asarray(bunch.images, dtype=np.float64) / 16.0
    labels = np.asarray(bunch.target, dtype=np.int64)
    return _to_xp(images, xp, dtype, device), _to_xp(labels, xp, None, device)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array stored in an IDX file (the MNIST format), read on the host; ``.gz`` files are unzipped.

    Format: two zero bytes, a type code (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32,
    0x0E float64), the number of dimensions k, k big-endian uint32 sizes, then the data in C order.
    A missing file, a wrong magic number, a truncated file or trailing bytes raise ``ValueError``
    naming the file.
    """
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise ValueError(f"IDX file {name!r} does not exist")
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(name, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as exc:  # a corrupt or truncated gzip stream
        raise ValueError(f"IDX file {name!r} cannot be read: {exc}") from None
    if len(raw) < 4:
        raise ValueError(f"IDX file {name!r} is truncated: {len(raw)} bytes, the header alone needs 4")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(
            f"IDX file {name!r} has magic bytes {raw[:4].hex()}, expected 0000TTKK with type TT in "
            f"{sorted(f'{k:02x}' for k in _IDX_DTYPES)}"
        )
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"IDX file {name!r} is truncated: {len(raw)} bytes, the header needs {header}")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "longer than its header says"
        raise ValueError(f"IDX file {name!r} is {what}: {len(raw)} bytes, shape {shape} needs {expected}")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find_idx(data_dir: str, stem: str) -> str:
    # the files circulate as train-images-idx3-ubyte, train-images.idx3-ubyte, with or without .gz
    dotted = stem.replace("-idx", ".idx")
    for candidate in (stem, dotted, stem + ".gz", dotted + ".gz"):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    raise ValueError(f"MNIST file {os.path.join(data_dir, stem)!r} (or .gz / {dotted!r}) does not exist")


def load_mnist(
    data_dir: str | os.PathLike, *, split: str = "train", xp: Any = None, dtype: Any = None, device: Any = None
) -> tuple[Array, Array]:
    """``(images, labels)`` of MNIST's ``split`` (``"train"`` or ``"test"``) from IDX files in ``data_dir``.

    Images (n, 28, 28) scaled to [0, 1] (pixel/255), labels int64. Nothing is downloaded: put
    ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and
    ``t10k-labels-idx1-ubyte`` (optionally ``.gz``) in ``data_dir``. A missing or malformed file,
    or images and labels of different counts, raise ``ValueError`` naming the file.
    """
    if split not in _MNIST_FILES:
        raise ValueError(f"load_mnist: split must be 'train' or 'test', got {split!r}")
    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        raise ValueError(f"load_mnist: data_dir {data_dir!r} is not a directory")
    image_file, label_file = (_find_idx(data_dir, stem) for stem in _MNIST_FILES[split])
    images = read_idx(image_file)
    labels = read_idx(label_file)
    if images.ndim != 3:
        raise ValueError(f"MNIST file {image_file!r} holds an array of shape {images.shape}, expected (n, H, W)")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"MNIST file {label_file!r} holds labels of shape {labels.shape}, expected ({images.shape[0]},) "
            f"to match {image_file!r}"
        )
    host = images.astype(np.float64) / 255.0
    return _to_xp(host, xp, dtype, device), _to_xp(labels.astype(np.int64), xp, None, device)


def patches(images: Array, patch_size: int) -> Array:
    """Cut images (..., H, W) into the sequence of flattened p×p patches (..., (H/p)(W/p), p²).

    Fig. 2 of Brantner's paper: the image is tiled by square patches, each patch is flattened into a
    vector, and the vectors form the transformer's input sequence (the paper's p² × n_patches matrix,
    stored here transposed, time then features). Patches are ordered row by row over the image
    (left to right, then top to bottom) and each patch is flattened row by row (C order); the
    Julia reference flattens column-major, which only permutes the features consistently for all
    patches. H and W must be divisible by p. The inverse is :func:`unpatch`.
    """
    xp = _backend.array_namespace(images=images)
    p = _check_patch_size(patch_size)
    if images.ndim < 2:
        raise ValueError(f"patches: images must have shape (..., H, W), got {tuple(images.shape)}")
    *batch, H, W = images.shape
    if H % p or W % p:
        raise ValueError(f"patches: image size {H}×{W} is not divisible by patch_size {p}")
    nb = len(batch)
    x = xp.reshape(images, (*batch, H // p, p, W // p, p))
    x = xp.permute_dims(x, (*range(nb), nb, nb + 2, nb + 1, nb + 3))  # (..., H/p, W/p, p, p)
    return xp.reshape(x, (*batch, (H // p) * (W // p), p * p))


def unpatch(sequence: Array, image_shape: tuple[int, int]) -> Array:
    """The inverse of :func:`patches`: (..., n_patches, p²) back to images (..., H, W)."""
    xp = _backend.array_namespace(sequence=sequence)
    if sequence.ndim < 2:
        raise ValueError(f"unpatch: sequence must have shape (..., n_patches, p²), got {tuple(sequence.shape)}")
    H, W = (int(s) for s in image_shape)
    *batch, n, d = sequence.shape
    p = math.isqrt(d)
    if p * p != d or H % p or W % p or (H // p) * (W // p) != n:
        raise ValueError(
            f"unpatch: a sequence of shape {tuple(sequence.shape)} (n_patches, p²) does not tile an image of "
            f"shape {(H, W)}"
        )
    nb = len(batch)
    x = xp.reshape(sequence, (*batch, H // p, W // p, p, p))
    x = xp.permute_dims(x, (*range(nb), nb, nb + 2, nb + 1, nb + 3))  # (..., H/p, p, W/p, p)
    return xp.reshape(x, (*batch, H, W))


def _check_patch_size(patch_size: Any) -> int:
    if isinstance(patch_size, bool) or not isinstance(patch_size, (int, np.integer)) or patch_size < 1:
        raise ValueError(f"patch_size must be a positive int, got {patch_size!r}")
    return int(patch_size)


def one_hot(labels: Array, n_classes: int, *, dtype: Any = None) -> Array:
    """Integer labels (...,) as one-hot rows (..., n_classes) of ``dtype`` (default: the default float).

    Labels outside 0 … n_classes − 1 raise ``ValueError``.
    """
    xp = _backend.array_namespace(labels=labels)
    if not xp.isdtype(labels.dtype, "integral"):
        raise TypeError(f"one_hot: labels must be integers, got dtype {labels.dtype}")
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 1:
        raise ValueError(f"one_hot: n_classes must be a positive int, got {n_classes!r}")
    dev = _backend.device(labels)
    if math.prod(labels.shape) > 0:
        lo, hi = int(xp.min(labels)), int(xp.max(labels))
        if lo < 0 or hi >= n_classes:
            raise ValueError(f"one_hot: labels must lie in [0, {n_classes - 1}], got values in [{lo}, {hi}]")
    dt = _backend.resolve_dtype(xp, dtype, dev)
    classes = xp.arange(int(n_classes), device=dev)
    return xp.astype(labels[..., None] == classes, dt)


def train_test_split(*arrays: Array, test_fraction: float = 0.2, seed: int = 0) -> tuple[tuple[Array, ...], ...]:
    """``(train, test)``: each a tuple holding every array's samples (axis 0) of that part.

    One permutation drawn from ``numpy.random.default_rng(seed)`` (so the split is the same on every
    backend) puts ⌈test_fraction·n⌉ samples in the test part and the rest in the training part;
    ``0 < test_fraction < 1`` and both parts must be non-empty.
    """
    if not arrays:
        raise ValueError("train_test_split needs at least one array")
    xp = _backend.array_namespace(*arrays)
    n = arrays[0].shape[0] if arrays[0].ndim else None
    for i, a in enumerate(arrays):
        if a.ndim < 1 or a.shape[0] != n:
            raise ValueError(f"train_test_split: array {i} has shape {tuple(a.shape)}, expected {n} samples on axis 0")
    assert n is not None  # array 0 has an axis 0 (checked in the loop)
    if not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
        raise ValueError(f"train_test_split: test_fraction must lie in (0, 1), got {test_fraction!r}")
    n_test = math.ceil(test_fraction * n)
    if n_test >= n:
        raise ValueError(f"train_test_split: {n} samples leave no training samples at test_fraction={test_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    dev = _backend.device(arrays[0])
    test_idx = xp.asarray(np.sort(perm[:n_test]), device=dev)
    train_idx = xp.asarray(np.sort(perm[n_test:]), device=dev)
    train = tuple(xp.take(a, train_idx, axis=0) for a in arrays)
    test = tuple(xp.take(a, test_idx, axis=0) for a in arrays)
    return train, test

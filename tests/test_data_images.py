"""Image data: IDX reader, MNIST loader, digits, patches, one-hot labels, train/test split.

Properties (exact unless stated):

* read_idx returns what the test wrote (uint8 images, int32 and float64 arrays; plain and .gz);
  a truncated file, trailing bytes, a wrong magic number or a missing file raise ValueError naming
  the file;
* load_mnist finds the IDX files in a directory, scales pixels to [0, 1] (pixel/255 to 1e-15) and
  refuses images and labels of different counts or a missing file, naming it;
* load_digits gives 1797 images 8×8 in [0, 1] and labels 0–9 on the backend under test;
* patches: shape (..., (H/p)(W/p), p²), patch k is the k-th tile row by row, flattened row by row;
  unpatch ∘ patches = id; non-divisible sizes raise;
* one_hot rows are unit vectors at the label; out-of-range labels raise;
* train_test_split partitions the samples (disjoint, complete), keeps rows aligned across arrays and
  is deterministic per seed.
"""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from _helpers import asarray, to_numpy
from geoarray.data import load_digits, load_mnist, one_hot, patches, read_idx, train_test_split, unpatch


def _idx_bytes(a: np.ndarray) -> bytes:
    code = {np.dtype("uint8"): 0x08, np.dtype("int32"): 0x0C, np.dtype("float64"): 0x0E}[a.dtype]
    header = bytes([0, 0, code, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape)
    return header + a.astype(a.dtype.newbyteorder(">")).tobytes()


@pytest.fixture
def images_labels():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(5, 8, 12), dtype=np.uint8), rng.integers(0, 10, size=5).astype(np.uint8)


def test_read_idx_round_trip(tmp_path, images_labels):
    images, labels = images_labels
    (tmp_path / "img").write_bytes(_idx_bytes(images))
    with gzip.open(tmp_path / "lab.gz", "wb") as fh:
        fh.write(_idx_bytes(labels))
    floats = np.random.default_rng(1).normal(size=(3, 2))
    ints = np.arange(-3, 3, dtype=np.int32)
    (tmp_path / "f").write_bytes(_idx_bytes(floats))
    (tmp_path / "i").write_bytes(_idx_bytes(ints))
    np.testing.assert_array_equal(read_idx(tmp_path / "img"), images)
    np.testing.assert_array_equal(read_idx(tmp_path / "lab.gz"), labels)
    np.testing.assert_array_equal(read_idx(tmp_path / "f"), floats)
    np.testing.assert_array_equal(read_idx(tmp_path / "i"), ints)


def test_read_idx_bad_files(tmp_path, images_labels):
    good = _idx_bytes(images_labels[0])
    cases = {
        "truncated-data": (good[:-7], "truncated"),
        "truncated-header": (good[:6], "truncated"),
        "tiny": (good[:2], "truncated"),
        "trailing": (good + b"\0", "longer"),
        "magic": (b"\x12\x34" + good[2:], "magic"),
        "typecode": (good[:2] + b"\x42" + good[3:], "magic"),
    }
    for name, (content, what) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ValueError, match=what) as info:
            read_idx(path)
        assert str(path) in str(info.value)
    (tmp_path / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"bad\.gz"):
        read_idx(tmp_path / "bad.gz")
    with pytest.raises(ValueError, match="does not exist") as info:
        read_idx(tmp_path / "missing")
    assert "missing" in str(info.value)


def test_load_mnist_from_a_directory(tmp_path, images_labels, xp, device):
    images, labels = images_labels
    (tmp_path / "train-images-idx3-ubyte").write_bytes(_idx_bytes(images))
    with gzip.open(tmp_path / "train-labels.idx1-ubyte.gz", "wb") as fh:
        fh.write(_idx_bytes(labels))
    x, y = load_mnist(tmp_path, xp=xp, device=device)
    np.testing.assert_allclose(to_numpy(x), images / 255.0, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(to_numpy(y), labels)
    assert x.shape == (5, 8, 12) and xp.isdtype(y.dtype, "integral")
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte"):
        load_mnist(tmp_path, split="test", xp=xp)
    (tmp_path / "train-labels.idx1-ubyte.gz").unlink()
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx_bytes(labels[:4]))
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte"):
        load_mnist(tmp_path, xp=xp)
    with pytest.raises(ValueError, match="not a directory"):
        load_mnist(tmp_path / "nowhere", xp=xp)
    with pytest.raises(ValueError, match="split"):
        load_mnist(tmp_path, split="validation", xp=xp)


def test_load_digits(xp, device):
    pytest.importorskip("sklearn", reason="load_digits needs scikit-learn (the demo extra)")
    x, y = load_digits(xp=xp, device=device)
    assert x.shape == (1797, 8, 8) and y.shape == (1797,)
    xn, yn = to_numpy(x), to_numpy(y)
    assert xn.min() == 0.0 and xn.max() == 1.0
    assert sorted(set(yn.tolist())) == list(range(10))


def test_patches_shape_order_and_round_trip(xp, device):
    host = np.arange(2 * 3 * 8 * 12, dtype=np.float64).reshape(2, 3, 8, 12)
    images = asarray(host, xp, device)
    P = patches(images, 4)
    assert P.shape == (2, 3, 6, 16)
    Pn = to_numpy(P)
    for k in range(6):
        r, c = divmod(k, 3)  # row by row over the 2×3 grid of tiles
        np.testing.assert_array_equal(Pn[1, 2, k], host[1, 2, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4].reshape(-1))
    np.testing.assert_array_equal(to_numpy(unpatch(P, (8, 12))), host)
    single = patches(asarray(host[0, 0], xp, device), 2)
    assert single.shape == (24, 4)
    np.testing.assert_array_equal(to_numpy(unpatch(single, (8, 12))), host[0, 0])
    with pytest.raises(ValueError, match="divisible"):
        patches(images, 5)
    with pytest.raises(ValueError, match="patch_size"):
        patches(images, 0)
    with pytest.raises(ValueError, match="tile"):
        unpatch(P, (8, 8))


def test_one_hot(xp, device):
    labels = xp.asarray(np.array([2, 0, 1, 2]), device=device)
    Y = to_numpy(one_hot(labels, 3))
    np.testing.assert_array_equal(Y, np.eye(3)[[2, 0, 1, 2]])
    with pytest.raises(ValueError, match="labels must lie"):
        one_hot(labels, 2)
    with pytest.raises(TypeError, match="integers"):
        one_hot(xp.asarray(np.array([0.0, 1.0]), device=device), 2)


def test_train_test_split(xp, device):
    x = asarray(np.arange(20.0).reshape(10, 2), xp, device)
    y = xp.asarray(np.arange(10), device=device)
    (xtr, ytr), (xte, yte) = train_test_split(x, y, test_fraction=0.3, seed=1)
    assert xte.shape == (3, 2) and xtr.shape == (7, 2)
    idx = np.concatenate([to_numpy(ytr), to_numpy(yte)])
    assert sorted(idx.tolist()) == list(range(10))
    np.testing.assert_array_equal(to_numpy(xtr)[:, 0], 2 * to_numpy(ytr))
    again = train_test_split(x, y, test_fraction=0.3, seed=1)
    np.testing.assert_array_equal(to_numpy(again[1][1]), to_numpy(yte))
    other = train_test_split(x, y, test_fraction=0.3, seed=2)
    assert to_numpy(other[1][1]).tolist() != to_numpy(yte).tolist()
    with pytest.raises(ValueError, match="test_fraction"):
        train_test_split(x, y, test_fraction=1.0)
    with pytest.raises(ValueError, match="samples on axis 0"):
        train_test_split(x, y[:5])

"""geoarray._io: the package's one home for file I/O.

* any pytree of arrays (NamedTuples, nested tuples, dicts, an empty NamedTuple, Python scalars among
  the leaves) round-trips bit-exactly through ``tree_arrays`` → ``.npz`` → ``read_tree(like=...)``, in
  ``like``'s namespace, dtypes and (torch) memory layout;
* a structure other than ``like``'s is refused naming both; a leaf that is no array is a TypeError;
* damage becomes one ``ValueError`` naming the file: truncation, a flipped data bit (zip CRC), an
  object array, a header declaring a huge shape (refused before any allocation: peak traced memory
  stays under 1 MB for a 500-byte file declaring 8 TB), bad JSON;
* ``atomic_write`` leaves the old file whole and no temporary file when the writer fails.
"""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile
from typing import NamedTuple

import numpy as np
import optree
import pytest

from _helpers import to_numpy
from geoarray import _io


class Moments(NamedTuple):
    mu: object
    nu: object


class Empty(NamedTuple):
    pass


def _tree(xp, device):
    f64 = xp.asarray(np.random.default_rng(0).normal(size=(3, 2)), device=device)
    f32 = xp.asarray(np.random.default_rng(1).normal(size=(4,)).astype(np.float32), device=device)
    i = xp.asarray(np.arange(5), device=device)
    b = xp.asarray(np.array([True, False]), device=device)
    return {"a": Moments(f64, (f32, Empty())), "b": [i, b, None], "c": Empty(), "n": 7, "x": 0.1 + 0.2}


def _round_trip(tmp_path, tree, like, name="t.npz"):
    path = tmp_path / name
    arrays = _io.tree_arrays(tree, {"format": "test", "version": 1}, what="test tree")
    _io.atomic_write(path, lambda fh: _io.write_npz(fh, arrays))
    return _io.read_tree(path, like, fmt="test", versions=(1,), what="test file")


def test_any_pytree_round_trips_bit_exactly(xp, device, tmp_path):
    tree = _tree(xp, device)
    like = optree.tree_map(lambda x: type(x)(0) if isinstance(x, (int, float)) else xp.zeros_like(x), tree)
    back, meta = _round_trip(tmp_path, tree, like)
    assert optree.tree_structure(back) == optree.tree_structure(tree)
    assert meta["format"] == "test" and "Moments" in meta["structure"] and "Empty" in meta["structure"]
    for a, b in zip(optree.tree_leaves(back), optree.tree_leaves(tree), strict=True):
        if isinstance(b, (int, float)):
            assert type(a) is type(b) and a == b
        else:
            assert a.dtype == b.dtype and np.array_equal(to_numpy(a), to_numpy(b))
    empty, _ = _round_trip(tmp_path, Empty(), Empty(), "e.npz")
    assert empty == Empty()


def test_torch_memory_layout_is_kept(backend, tmp_path):
    if backend.kind != "torch":
        pytest.skip("memory layout (strides) is a torch notion here")
    import torch

    col = torch.linalg.qr(torch.randn(6, 3, dtype=torch.float64))[0]  # LAPACK returns column-major
    assert col.stride() == (1, 6)
    back, _ = _round_trip(tmp_path, (col,), (col * 0,))
    assert back[0].stride() == col.stride() and torch.equal(back[0], col)


def test_other_structure_and_non_array_leaves(xp, device, tmp_path):
    tree = _tree(xp, device)
    path = tmp_path / "t.npz"
    _round_trip(tmp_path, tree, tree)
    other = dict(tree, c=Moments(tree["b"][0], tree["b"][0]))
    with pytest.raises(ValueError, match=r"t\.npz.*another structure"):
        _io.read_tree(path, other, fmt="test", versions=(1,), what="test file")
    with pytest.raises(ValueError, match=r"t\.npz.*format version"):
        _io.read_tree(path, tree, fmt="test", versions=(2,), what="test file")
    with pytest.raises(TypeError, match="leaf 0 of the test tree is a str"):
        _io.tree_arrays(["text"], {}, what="test tree")


def _npz(**arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _header_declaring(shape):
    """An .npz whose one member's header declares ``shape`` (float64) but holds 8 bytes."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False, "shape": shape})
    member.write(b"\x00" * 8)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("leaf_00000.npy", member.getvalue())
    return out.getvalue()


@pytest.mark.parametrize("damage", ["truncated", "bitflip", "object", "huge", "negative", "garbage", "not_npy"])
def test_damage_is_one_valueerror_naming_the_file(tmp_path, damage):
    good = _npz(leaf_00000=np.arange(1000.0))
    if damage == "truncated":
        raw = good[: len(good) // 2]
    elif damage == "bitflip":
        raw = bytearray(good)
        raw[len(good) // 3] ^= 0x01  # inside the array data: caught by the zip CRC
        raw = bytes(raw)
    elif damage == "object":
        raw = _npz(leaf_00000=np.array([{"a": 1}], dtype=object))
    elif damage == "huge":
        raw = _header_declaring((10**12,))
    elif damage == "negative":
        raw = _header_declaring((-1,))
    elif damage == "garbage":
        raw = b"PK\x03\x04" + b"\xff" * 200
    else:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as zf:
            zf.writestr("evil.txt", "hello")
        raw = out.getvalue()
    path = tmp_path / "f.npz"
    path.write_bytes(raw)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"f\.npz.*(damaged|truncated)"):
            _io.read_npz(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000 + 4 * len(raw), peak


def test_bad_json_names_the_file(tmp_path):
    path = tmp_path / "m.json"
    path.write_bytes(b'{"a": ')
    with pytest.raises(ValueError, match=r"m\.json.*damaged"):
        _io.read_json(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=r"m\.json"):
        _io.read_json(path)
    _io.write_json(path, {"x": 0.1 + 0.2, "nan": float("nan")})
    back = _io.read_json(path)
    assert back["x"] == 0.1 + 0.2 and back["nan"] != back["nan"]
    assert json.loads(path.read_text())["x"] == 0.30000000000000004


def test_atomic_write_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")

    def fails(fh):
        fh.write(b"new, partly")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match=r"could not write .*f\.bin.*No space left.*left as it was"):
        _io.atomic_write(path, fails)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    _io.atomic_write(path, lambda fh: fh.write(b"new"))
    assert path.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]

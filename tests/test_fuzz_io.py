"""Fuzzing the file entry points: ``optim.load_state`` and ``train.load_checkpoint`` on mutated files.

Hypothesis (derandomized, so CI is reproducible) mutates a valid optimizer-state file and a valid
checkpoint directory: truncation, bit flips, overwritten byte runs, inserted bytes, and structural
edits of one array (another dtype, another shape, an object array, a header declaring a huge shape).
Every outcome must be either the original state bit for bit (a mutation of bytes nothing reads, such
as a zip timestamp or JSON whitespace) or a ``ValueError`` naming the file — never another exception
type, never a silently different state, and never more than a few MB allocated for a ~10 kB file
(traced peak ≤ 4 MB). The loaded ``like`` trees are checked unchanged after every case.

Cases per target: 150 byte-level mutations of ``load_state``, 60 structural edits of ``load_state``,
100 byte-level mutations of one file of ``load_checkpoint`` (see ``CASES``). Defects of the former
readers (``numpy.load``) that the structural target catches: a header declaring 10¹² float64 raised a
bare ``MemoryError``, and one declaring 2·10⁹ float64 (16 GB) in a 300-byte file allocated the 16 GB
before failing; ``geoarray._io.read_npz`` checks the declared size against the bytes present first.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import tracemalloc
import zipfile

import numpy as np
import optree
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _helpers import to_numpy
from geoarray import nn, optim
from geoarray.models import ClassificationTransformer
from geoarray.train import fit, list_checkpoints, load_checkpoint

CASES = {"state_bytes": 150, "state_structure": 60, "checkpoint_bytes": 100}
PEAK = 4_000_000
_SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.function_scoped_fixture]}


def _host(tree):
    return [to_numpy(leaf) for leaf in optree.tree_leaves(tree)]


def _same(a, b):
    return len(a) == len(b) and all(u.dtype == v.dtype and np.array_equal(u, v) for u, v in zip(a, b, strict=True))


@pytest.fixture
def saved(xp, device, tmp_path):
    """A small trained run: its checkpoint directory, a state file, the like trees and the expected leaves."""
    model = ClassificationTransformer(4, 2, 3, n_heads=2, n_layers=1)
    params = model.init(0, xp=xp, dtype="float64", device=device)
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.normal(size=(16, 2, 4)), dtype=xp.float64, device=device)
    y = xp.asarray(np.eye(3)[rng.integers(0, 3, 16)], dtype=xp.float64, device=device)
    opt = optim.Adam(lr=0.05)
    ck = tmp_path / "ck"
    r = fit(model, params, (x, y), opt, nn.ClassificationL2Loss(), epochs=1, batch_size=8, progress=False,
            jit=False, checkpoint_path=ck)  # fmt: skip
    state_file = tmp_path / "state.npz"
    optim.save_state(state_file, r.opt_state)
    like = {"like_params": params, "like_state": opt.init(params, model.manifolds())}
    return {
        "ckpt": list_checkpoints(ck)[-1][1],
        "state_file": state_file,
        "like": like,
        "like_host": _host(like),
        "state": _host(r.opt_state),
        "run": _host((r.params, r.opt_state)),
    }


def _mutate(raw: bytes, data) -> bytes:
    kind = data.draw(st.sampled_from(["truncate", "flip", "overwrite", "insert"]), label="kind")
    n = len(raw)
    if kind == "truncate":
        return raw[: data.draw(st.integers(0, n - 1), label="keep")]
    out = bytearray(raw)
    if kind == "flip":
        for pos in data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4), label="positions"):
            out[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    elif kind == "overwrite":
        pos = data.draw(st.integers(0, n - 1), label="pos")
        chunk = data.draw(st.binary(min_size=1, max_size=64), label="chunk")
        out[pos : pos + len(chunk)] = chunk
    else:
        pos = data.draw(st.integers(0, n), label="pos")
        out[pos:pos] = data.draw(st.binary(min_size=1, max_size=64), label="chunk")
    return bytes(out)


def _outcome(load, path, expected, like, like_host):
    """Run ``load()``: the expected leaves or a ValueError naming ``path``; bounded memory; like untouched."""
    tracemalloc.start()
    try:
        try:
            got = load()
        except ValueError as exc:
            assert os.path.basename(path) in str(exc), str(exc)
            got = None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= PEAK, peak
    if got is not None:
        assert _same(_host(got), expected), "a mutated file loaded into a different state without an error"
    assert _same(_host(like), like_host), "the like trees were changed"


@settings(max_examples=CASES["state_bytes"], **_SETTINGS)
@given(data=st.data())
def test_load_state_on_mutated_bytes(saved, tmp_path, data):
    raw = saved["state_file"].read_bytes()
    path = tmp_path / "mutated.npz"
    path.write_bytes(_mutate(raw, data))
    like = saved["like"]["like_state"]
    _outcome(lambda: optim.load_state(path, like=like), path, saved["state"], like, _host(like))


def _edit(arrays: dict, data) -> dict:
    names = sorted(k for k in arrays if k.startswith("leaf_"))
    name = data.draw(st.sampled_from(names), label="leaf")
    a = arrays[name]
    kind = data.draw(st.sampled_from(["dtype", "shape", "object", "drop", "extra"]), label="edit")
    out = dict(arrays)
    if kind == "dtype":
        dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.complex128, np.bool_])
        out[name] = a.astype(data.draw(dtypes.filter(lambda d: np.dtype(d) != a.dtype), label="dtype"))
    elif kind == "shape":
        out[name] = np.zeros((*a.shape, data.draw(st.integers(1, 3))), dtype=a.dtype)
    elif kind == "object":
        out[name] = np.array([None, {"x": 1}], dtype=object)
    elif kind == "drop":
        del out[name]
    else:
        out["leaf_99999"] = np.zeros(3)
    return out


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: v for k, v in arrays.items() if v.dtype != object})
    if any(v.dtype == object for v in arrays.values()):  # numpy writes objects only by pickling: write the member
        with zipfile.ZipFile(buf, "a") as zf:
            for k, v in arrays.items():
                if v.dtype == object:
                    member = io.BytesIO()
                    np.save(member, v, allow_pickle=True)
                    zf.writestr(f"{k}.npy", member.getvalue())
    return buf.getvalue()


def _huge_header_member(shape) -> bytes:
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False, "shape": shape})
    member.write(b"\x00" * 64)
    return member.getvalue()


@settings(max_examples=CASES["state_structure"], **_SETTINGS)
@given(data=st.data())
def test_load_state_on_structurally_edited_files(saved, tmp_path, data):
    with np.load(saved["state_file"], allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    path = tmp_path / "edited.npz"
    if data.draw(st.booleans(), label="huge header"):
        name = data.draw(st.sampled_from(sorted(k for k in arrays if k.startswith("leaf_"))), label="leaf")
        huge = [(2 * 10**9,), (10**12,), (2**31, 2**31), (10**6, 10**6, 10**6)]
        shape = data.draw(st.sampled_from(huge), label="shape")
        raw = _npz_bytes({k: v for k, v in arrays.items() if k != name})
        buf = io.BytesIO(raw)
        with zipfile.ZipFile(buf, "a") as zf:
            zf.writestr(f"{name}.npy", _huge_header_member(shape))
        path.write_bytes(buf.getvalue())
    else:
        path.write_bytes(_npz_bytes(_edit(arrays, data)))
    like = saved["like"]["like_state"]
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"edited\.npz"):
            optim.load_state(path, like=like)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= PEAK, peak


@settings(max_examples=CASES["checkpoint_bytes"], **_SETTINGS)
@given(data=st.data())
def test_load_checkpoint_on_a_mutated_file(saved, tmp_path, data):
    root = tempfile.mkdtemp(dir=tmp_path)
    try:
        ckpt = os.path.join(root, "ckpt-000000002")
        shutil.copytree(saved["ckpt"], ckpt)
        name = data.draw(st.sampled_from(["params.npz", "opt_state.npz", "meta.json", "manifest.json"]), label="file")
        f = os.path.join(ckpt, name)
        with open(f, "rb") as fh:
            raw = fh.read()
        with open(f, "wb") as fh:
            fh.write(_mutate(raw, data))
        like = saved["like"]

        def load():
            params, state, _ = load_checkpoint(ckpt, **like)
            return params, state

        _outcome(load, ckpt, saved["run"], like, saved["like_host"])
    finally:
        shutil.rmtree(root)

"""Fuzzing the manifold contract (issue #29, item 6): Stiefel, Grassmann and SymplecticStiefel.

Hypothesis (derandomized) draws constructor arguments (ints, zero, negatives, floats, bools, strings,
None, NumPy ints), ``random``'s seed / batch shape / dtype, and arrays for ``is_point``, ``rgrad``,
``global_section``, ``lift``, ``retraction`` and ``apply_retraction`` with odd shapes (a missing or an
extra row, a transposed point, no matrix axes, non-broadcasting batches), every dtype the backend has
(float64, float32, float16, int64, complex128, bool, and two different float dtypes side by side) and
NaN / ±inf / 1e30 entries. Every outcome must be

* a ``ValueError``/``TypeError`` naming the argument (``N``, ``Y``, ``dL``, ``W``, ...), or
* a correct result: on valid input (float32/float64, matching shapes and dtypes, finite entries) the
  call must succeed, its result be finite, ``is_point`` be True at a random point, ``rgrad`` be tangent
  (|YᵀΔ + ΔᵀY| or its symplectic analogue within a dtype tolerance), and retracted points lie on the
  manifold; non-finite input may give a non-finite result or an error, never another exception type;

and no input array is changed (bit for bit). Cases per target: ``CASES`` (a tenth on JAX, which compiles
each kernel per shape:
``_fuzz.cases``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _fuzz import DTYPES, SETTINGS, finite, fuzz, host_array, outcome, to_backend
from _helpers import to_numpy
from geoarray.manifolds import Grassmann, Stiefel, SymplecticStiefel

CASES = {"constructors": 120, "random": 80, "operations": 250, "tangent": 150}

_SIZES = st.sampled_from([1, 2, 3, 4, 6, 0, -1, 2.0, 2.5, float("nan"), True, False, None, "3", np.int64(4), [2]])
_CHOICES = st.sampled_from(["householder", "random", "transported", "rotated", "geodesic", "cayley", "", None, 1])


def _valid_size(v, even=False):
    return (
        not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, np.integer)) and v >= 1 and (not even or v % 2 == 0)
    )


@settings(max_examples=CASES["constructors"], **SETTINGS)
@given(data=st.data())
def test_constructors_take_valid_sizes_and_choices_or_raise_naming_them(data):
    kind = data.draw(st.sampled_from([Stiefel, Grassmann, SymplecticStiefel]), label="kind")
    N, n = data.draw(_SIZES, label="N"), data.draw(_SIZES, label="n")
    kw = {}
    if data.draw(st.booleans(), label="section given"):
        kw["section"] = data.draw(_CHOICES, label="section")
    if data.draw(st.booleans(), label="retraction given"):
        kw["retraction_method"] = data.draw(_CHOICES, label="retraction_method")
    if data.draw(st.booleans(), label="max_doublings given"):
        kw["max_doublings"] = data.draw(_SIZES, label="max_doublings")
    sym = kind is SymplecticStiefel
    names = ("N2", "n2") if sym else ("N", "n")
    M, err = outcome(lambda: kind(N, n, **kw), (*names, *kw, "needs"))
    sections = ("householder",) if sym else ("householder", "random", "transported", "rotated")
    valid = (
        _valid_size(N, sym)
        and _valid_size(n, sym)
        and n <= N
        and kw.get("section", "householder") in sections
        and kw.get("retraction_method", "geodesic") in ("geodesic", "cayley")
        and _valid_size(kw.get("max_doublings", 64))
    )
    assert (err is None) == valid, f"{kind.__name__}({N!r}, {n!r}, **{kw!r}) gave {err!r}"
    if M is not None:
        assert M.point_shape == (int(N), int(n))


def test_random_points_for_valid_seeds_batch_shapes_and_dtypes(xp, device, backend):
    fuzz(CASES["random"], backend)(lambda data: _random_case(xp, device, data))()


def _random_case(xp, device, data):
    M = data.draw(st.sampled_from([Stiefel(5, 2), Grassmann(4, 4), SymplecticStiefel(6, 2)]), label="M")
    seed = data.draw(st.sampled_from([0, 7, 2**40, -1, 1.5, "0", None, True]), label="seed")
    batch = data.draw(st.sampled_from([(), (3,), (2, 1), (0,), (-1,), (2.0,), 3, "ab", None]), label="batch_shape")
    dtype = data.draw(st.sampled_from([None, "float32", "float64", *DTYPES, "float128", "nope"]), label="dtype")
    dt = getattr(xp, dtype, None) if dtype is not None else None
    if dtype is not None and dt is None:  # a name: the library must refuse it, or the backend has no such dtype
        dt = dtype
    Y, _ = outcome(
        lambda: M.random(seed, xp=xp, batch_shape=batch, dtype=dt, device=device),
        ("seed", "shape", "dtype", "batch"),
    )
    if Y is None:
        return
    assert isinstance(batch, tuple) and all(isinstance(b, int) and b >= 0 for b in batch), batch
    assert tuple(Y.shape) == (*batch, *M.point_shape)
    assert finite(Y) and M.is_point(Y)


def _manifold(data):
    kind = data.draw(st.sampled_from(["stiefel", "grassmann", "symplectic"]), label="kind")
    if kind == "symplectic":
        N = data.draw(st.integers(1, 3), label="N")
        return SymplecticStiefel(2 * N, 2 * data.draw(st.integers(1, N), label="n"))
    N = data.draw(st.integers(1, 6), label="N")
    cls = Stiefel if kind == "stiefel" else Grassmann
    return cls(N, data.draw(st.integers(1, N), label="n"))


def _reshape(a: np.ndarray, how: str, rng) -> np.ndarray:
    if how == "extra row":
        return np.concatenate([a, rng.normal(size=(*a.shape[:-2], 1, a.shape[-1]))], axis=-2)
    if how == "missing column":
        return a[..., :-1]
    if how == "transposed" and a.shape[-1] != a.shape[-2]:
        return np.swapaxes(a, -1, -2)
    if how == "flat":
        return a.reshape(-1)
    if how == "scalar":
        return np.asarray(a.reshape(-1)[0])
    return a


_FLOATS = ("float32", "float64")


def _dtypes(xp):
    return [d for d in DTYPES if getattr(xp, d, None) is not None]  # array-api-strict has no float16


_SPECIAL = st.sampled_from(["finite"] * 6 + ["nan", "inf", "-inf", "huge"])
_SHAPE = st.sampled_from(["ok"] * 6 + ["extra row", "missing column", "transposed", "flat", "scalar"])


def _check_point(M, Y, dtype):
    if isinstance(M, SymplecticStiefel):  # noncompact: the constraint error scales with ‖Y‖²
        scale = 1.0 + float(np.max(np.abs(to_numpy(Y)))) ** 2
        return M.is_point(Y, atol=(1e-9 if dtype == "float64" else 1e-3) * scale)
    return M.is_point(Y)


def test_manifold_operations_on_fuzzed_arrays(xp, device, backend):
    fuzz(CASES["operations"], backend)(lambda data: _operation_case(xp, device, data))()


def _operation_case(xp, device, data):
    M = _manifold(data)
    batch = data.draw(st.sampled_from([(), (1,), (3,), (2, 2)]), label="batch")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    op = data.draw(
        st.sampled_from(["is_point", "rgrad", "global_section", "lift", "retraction", "apply_retraction"]), label="op"
    )
    # Y: a point (drawn in float64), then perhaps cast, damaged or reshaped
    y_dtype, y_special, y_shape = (
        data.draw(st.sampled_from(["float64"] * 4 + ["float32"] * 2 + _dtypes(xp)), "Y dtype"),
        data.draw(_SPECIAL, "Y entries"),
        data.draw(_SHAPE, "Y"),
    )
    Y64 = to_numpy(M.random(int(rng.integers(2**31)), xp=np, batch_shape=batch, dtype=np.float64))
    Yh = Y64.copy()
    if y_special != "finite":
        Yh.reshape(-1)[rng.integers(Yh.size)] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "huge": 1e30}[y_special]
    Y = to_backend(_reshape(Yh, y_shape, rng), xp, device, y_dtype)
    y_shape = "ok" if y_shape == "transposed" and M.point_shape[0] == M.point_shape[1] else y_shape
    # dL: a Euclidean gradient of another batch shape perhaps, with its own dtype, entries and shape
    g_batch = data.draw(st.sampled_from([batch, batch, (), (1,), (5,), (2, 3)]), label="dL batch")
    g_dtype = data.draw(st.sampled_from([y_dtype] * 4 + _dtypes(xp)), label="dL dtype")
    g_special, g_shape = data.draw(_SPECIAL, label="dL entries"), data.draw(_SHAPE, label="dL")
    g_shape = "ok" if g_shape == "transposed" and M.point_shape[0] == M.point_shape[1] else g_shape
    G = to_backend(_reshape(host_array(rng, (*g_batch, *M.point_shape), g_special), g_shape, rng), xp, device, g_dtype)
    y_ok = y_dtype in _FLOATS and y_shape == "ok"
    g_ok = g_dtype == y_dtype and g_shape == "ok"
    try:
        out_batch = np.broadcast_shapes(batch, g_batch)
    except ValueError:
        g_ok, out_batch = False, None
    finite_in = y_special == "finite"

    if op == "is_point":
        res, err = outcome(lambda: M.is_point(Y), ("Y",), Y)
        if err is None:
            assert isinstance(res, bool)
            assert y_shape == "ok" and y_dtype in (*_FLOATS, "float16"), f"is_point accepted {y_shape} {y_dtype}"
            assert res == (y_special == "finite") or y_dtype == "float16" or y_special == "huge"
        else:
            assert not y_ok, err
        return
    if op == "rgrad":
        res, err = outcome(lambda: M.rgrad(Y, G), ("Y", "dL"), (Y, G))
        valid = y_ok and g_ok
        if err is None:
            assert y_shape == "ok" and g_shape == "ok" and y_dtype in (*_FLOATS, "float16"), (y_shape, g_shape)
            assert g_dtype == y_dtype, "rgrad promoted two dtypes silently"
            assert tuple(res.shape) == (*out_batch, *M.point_shape)
            if valid and finite_in and g_special == "finite":
                assert finite(res), "rgrad gave a non-finite result from finite input"
                YY = xp.broadcast_to(Y, res.shape)
                assert M.is_tangent(YY, res, atol=1e-8 if y_dtype == "float64" else 2e-3)
        else:
            assert not valid, err
        return
    if op == "global_section":
        res, err = outcome(lambda: M.global_section(Y), ("Y",), Y)
        assert (err is None) or not y_ok, err
        if err is None:
            assert y_shape == "ok" and y_dtype in (*_FLOATS, "float16")
        return
    # lift and the retractions need a section of Y
    lam, err = outcome(lambda: M.global_section(Y), ("Y",), Y)
    if err is not None:
        assert not y_ok, err
        return
    if op == "lift":
        res, err = outcome(lambda: M.lift(Y, lam, G), ("Y", "dL", "lam"), (Y, G))
        if err is None:
            assert g_shape == "ok" and g_dtype == y_dtype, "lift accepted a wrong gradient"
            if y_ok and g_ok and finite_in and g_special == "finite":
                assert finite(res), "lift gave a non-finite result from finite input"
        else:
            assert not (y_ok and g_ok), err
        return
    # W: the lift of a (finite or damaged) gradient at the point, scaled to an optimizer step, in its
    # own float dtype; a retraction must refuse a W of another dtype or manifold than its section
    w_dtype = data.draw(st.sampled_from([y_dtype, y_dtype, "float32", "float64"]), label="W dtype")
    Yw = to_backend(Y64, xp, device, w_dtype)
    Gw = to_backend(host_array(rng, Y64.shape, g_special if g_special != "huge" else "finite"), xp, device, w_dtype)
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # a NaN gradient makes a NaN element
        warnings.simplefilter("ignore", RuntimeWarning)
        W = M.lift(Yw, M.global_section(Yw), Gw) * 0.1
    other = data.draw(st.booleans(), label="W of another manifold")
    if other:  # a horizontal element of the wrong size
        M2 = type(M)(*(2 * s for s in M.point_shape))
        W = M2.lift(*(lambda Y2: (Y2, M2.global_section(Y2)))(M2.random(0, xp=xp, dtype=Yw.dtype, device=device)),
                    xp.zeros(M2.point_shape, dtype=Yw.dtype, device=device))  # fmt: skip
    w_ok = w_dtype == y_dtype and not other
    finite_w = g_special == "finite" or g_special == "huge"
    if op == "retraction":
        res, err = outcome(lambda: M.retraction(W), ("W", "A", "B"), W)
        if err is None:
            assert not other, "retraction accepted an element of another manifold"
            if finite_w:
                assert finite(res) and _check_point(M, res, w_dtype)
        else:
            assert other, err
        return
    res, err = outcome(lambda: M.apply_retraction(lam, W), ("W", "Y", "lam", "A", "B"), (Y, W))
    if err is None:
        assert w_ok, "apply_retraction accepted W of another dtype or manifold than its section"
        if y_ok and finite_in and finite_w and y_special == "finite":
            assert finite(res) and _check_point(M, res, y_dtype)
            assert tuple(res.shape) == (*batch, *M.point_shape)
    else:
        assert not (y_ok and w_ok), err


def test_tangent_operations_on_fuzzed_arrays(xp, device, backend):
    fuzz(CASES["tangent"], backend)(lambda data: _tangent_case(xp, device, data))()


def _tangent_case(xp, device, data):
    """is_tangent, metric, project, omega and spectral_direction at a valid point, on a drawn D."""
    M = _manifold(data)
    ops = ["is_tangent", "metric"] + ([] if isinstance(M, SymplecticStiefel) else ["project", "spectral_direction"])
    op = data.draw(st.sampled_from([*ops, "omega"]), label="op")
    batch = data.draw(st.sampled_from([(), (2,)]), label="batch")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    Y = M.random(int(rng.integers(2**31)), xp=xp, batch_shape=batch, dtype=xp.float64, device=device)
    d_dtype = data.draw(st.sampled_from(["float64"] * 4 + _dtypes(xp)), label="D dtype")
    special, shape = data.draw(_SPECIAL, label="D entries"), data.draw(_SHAPE, label="D")
    shape = "ok" if shape == "transposed" and M.point_shape[0] == M.point_shape[1] else shape
    D = to_backend(_reshape(host_array(rng, (*batch, *M.point_shape), special), shape, rng), xp, device, d_dtype)
    if data.draw(st.integers(0, 9), label="None") == 0:
        D, d_dtype = None, "None"
    valid = d_dtype == "float64" and shape == "ok"
    call = {
        "is_tangent": lambda: M.is_tangent(Y, D),
        "metric": lambda: M.metric(Y, D, D),
        "project": lambda: M.project(Y, D),
        "spectral_direction": lambda: M.spectral_direction(Y, D),
        "omega": lambda: M.omega(Y, D),
    }[op]
    res, err = outcome(call, ("D", "D1", "G", "Y"), (Y, D))
    if err is not None:
        assert not valid, err
        return
    assert valid, f"{op} accepted D of {d_dtype}, {shape}"
    if special == "finite" and op != "is_tangent":
        assert finite(res), f"{op}: non-finite result from finite input"
    if op == "project" and special == "finite":
        assert M.is_tangent(Y, res, atol=1e-10)


def test_an_array_on_another_device_is_refused_naming_it(xp, device, backend):
    if backend.kind != "torch":
        pytest.skip("only torch has a second device on every CPU machine (meta)")
    import torch

    M = Stiefel(5, 2)
    Y = M.random(0, xp=xp, device=device)
    G = torch.zeros((5, 2), dtype=Y.dtype, device="meta")
    with pytest.raises(ValueError, match=r"dL is on device meta"):
        M.rgrad(Y, G)
    lam = M.global_section(Y)
    with pytest.raises(ValueError, match=r"dL is on device meta"):
        M.lift(Y, lam, G)


# -- defects the targets above found (regressions) ---------------------------------------------------


@pytest.mark.parametrize("M", [Stiefel(5, 2), Grassmann(5, 2)])
def test_spectral_direction_names_a_missing_gradient(xp, device, M):
    # before: AttributeError "'NoneType' object has no attribute 'dtype'"
    with pytest.raises(TypeError, match="G must be an array, got None"):
        M.spectral_direction(M.random(0, xp=xp, device=device), None)


@pytest.mark.parametrize("M", [Stiefel(4, 2), Grassmann(4, 2), SymplecticStiefel(4, 2)])
def test_random_refuses_a_batch_shape_that_is_not_a_tuple_of_ints(xp, device, M):
    # before: batch_shape=3 failed with "'int' object is not iterable", "ab" with int()'s message, and
    # (2.0,) was taken as (2,)
    with pytest.raises(TypeError, match=r"batch_shape must be a tuple of non-negative ints, got 3; pass \(3,\)"):
        M.random(0, xp=xp, batch_shape=3, device=device)
    for bad in ["ab", (2.0,), (True,), (-1,), None]:
        with pytest.raises(TypeError, match="batch_shape must be a tuple of non-negative ints"):
            M.random(0, xp=xp, batch_shape=bad, device=device)
    assert tuple(M.random(0, xp=xp, batch_shape=[2, np.int64(1)], device=device).shape) == (2, 1, *M.point_shape)


@pytest.mark.parametrize("M", [Stiefel(4, 2), Grassmann(4, 2), SymplecticStiefel(4, 2)])
def test_a_half_precision_point_gets_a_type_error_naming_it_not_a_backend_error(xp, device, M):
    # before: numpy's "array type float16 is unsupported in linalg", torch's NotImplementedError
    # ("geqrf_cpu" not implemented for 'Half'), JAX's NotImplementedError from the QR
    if getattr(xp, "float16", None) is None:
        pytest.skip("this backend has no float16")
    Y = xp.astype(M.random(0, xp=xp, dtype=xp.float64, device=device), xp.float16)
    before = to_numpy(Y).copy()
    with pytest.raises(TypeError, match=r"Y has dtype float16: sections need float32 or float64"):
        M.global_section(Y)
    with pytest.raises(TypeError, match=r"Y has dtype float16"):
        M.apply_retraction(M.global_section(Y), None)
    assert to_numpy(Y).tobytes() == before.tobytes()
    assert M.is_point(Y)  # membership is checked in float32 arithmetic (documented)


def test_symplectic_is_point_of_an_empty_batch_is_true(xp, device):
    # before: "zero-size array to reduction operation maximum which has no identity" (a max over nothing)
    M = SymplecticStiefel(6, 2)
    Y = M.random(0, xp=xp, batch_shape=(0,), device=device)
    assert (
        tuple(Y.shape) == (0, 6, 2)
        and M.is_point(Y)
        and Stiefel(6, 2).is_point(Stiefel(6, 2).random(0, xp=xp, batch_shape=(0,), device=device))
    )

"""The backend layer: namespaces, mixed inputs, dtype policy, fast-path registry, import weight."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import geoarray
from _helpers import asarray, assert_agree, assert_close, to_numpy
from geoarray import _backend, linalg


def _other_namespace(backend):
    """An array of a second library, to mix with the backend under test."""
    if backend.kind == "numpy":
        strict = pytest.importorskip("array_api_strict", reason="array-api-strict is the second library here")
        return strict.asarray([[1.0, 0.0], [0.0, 1.0]])
    return np.eye(2)


def test_namespace_of_inputs(xp, device, backend):
    a = asarray(np.eye(3), xp, device)
    ns = _backend.array_namespace(a)
    assert _backend.backend_name(ns) == backend.kind
    assert _backend.device(a) == device


def test_as_namespace_accepts_raw_modules(backend):
    raw = {
        "numpy": "numpy",
        "torch": "torch",
        "array_api_strict": "array_api_strict",
        "jax": "jax.numpy",
        "cupy": "cupy",
    }[backend.kind]
    module = pytest.importorskip(raw)
    ns = _backend.as_namespace(module)
    assert _backend.backend_name(ns) == backend.kind
    assert hasattr(ns, "matrix_transpose")


def test_as_namespace_rejects_non_namespaces():
    with pytest.raises(TypeError, match="xp must be an array namespace"):
        _backend.as_namespace("numpy")


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b: linalg.solve(a, b),
        lambda a, b: linalg.solve_vectors(a, b[..., 0]),
        lambda a, b: linalg.apply_q(a, a, b),
        lambda a, b: linalg.apply_qt(a, a, b),
    ],
    ids=["solve", "solve_vectors", "apply_q", "apply_qt"],
)
def test_mixed_namespaces_raise_type_error_naming_both(xp, device, backend, call):
    a = asarray(np.eye(2), xp, device)
    b = _other_namespace(backend)
    with pytest.raises(TypeError, match="different array libraries") as info:
        call(a, b)
    message = str(info.value)
    assert backend.kind in message
    other = "array_api_strict" if backend.kind == "numpy" else "numpy"
    assert other in message


def test_non_array_input_is_a_type_error():
    with pytest.raises(TypeError, match="A is not an array"):
        linalg.expm([[0.0, 1.0], [-1.0, 0.0]])


def test_default_float_is_float64(xp, device):
    assert geoarray.default_float(xp, device) == xp.float64


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_resolve_dtype_names_and_objects(xp, device, name):
    dt = geoarray.resolve_dtype(xp, name, device)
    assert dt == getattr(xp, name)
    assert geoarray.resolve_dtype(xp, dt, device) == dt


@pytest.mark.parametrize("bad", ["int32", "float16", "complex128"])
def test_resolve_dtype_rejects_non_float_names(xp, device, bad):
    with pytest.raises(TypeError, match="dtype must be 'float32' or 'float64'"):
        geoarray.resolve_dtype(xp, bad, device)


def test_resolve_dtype_rejects_integer_dtype_objects(xp, device):
    with pytest.raises(TypeError, match="real floating dtype"):
        geoarray.resolve_dtype(xp, xp.int64, device)


def test_float64_unavailable_message_names_the_fix(backend):
    if backend.kind == "jax":
        import jax.numpy as jnp

        msg = _backend._float64_missing_message(jnp)
        assert "jax_enable_x64" in msg
    elif backend.kind == "array_api_strict":
        strict = backend.xp
        with pytest.raises(TypeError, match="no float64"):
            geoarray.resolve_dtype(strict, "float64", strict.Device("no_float64"))
        assert geoarray.default_float(strict, strict.Device("no_float64")) == strict.float32
    else:
        pytest.skip(f"{backend.kind} always has float64 on this device (message tested on jax, array-api-strict)")


@pytest.mark.parametrize("fn", [linalg.expm, linalg.cayley, linalg.skew, linalg.sym, linalg.householder_qr])
def test_integer_inputs_raise_type_error(xp, device, fn):
    a = xp.asarray([[1, 2], [3, 4]], dtype=xp.int64, device=device)
    with pytest.raises(TypeError, match=r"[AC] must have a real floating dtype"):
        fn(a)


def test_solve_inv_and_clip_equal_the_namespaces_own(xp, device):
    """_backend.solve, inv and clip (which on torch and CuPy leave out a host check or a boolean mask)
    agree with xp.linalg.solve, xp.linalg.inv and xp.clip to AGREE_RTOL; on torch a singular matrix gives
    non-finite entries instead of an error (nothing is read back to raise it)."""
    A = asarray([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], xp, device)
    B = asarray([[1.0, 2.0], [0.0, -1.0], [3.0, 0.5]], xp, device)
    assert_agree(_backend.solve(A, B, xp), xp.linalg.solve(A, B))
    assert_agree(_backend.inv(A, xp), xp.linalg.inv(A))
    x = asarray([-2.0, -0.5, 0.0, 0.5, 2.0], xp, device)
    assert_agree(_backend.clip(x, xp, min=-1.0, max=1.0), xp.clip(x, min=-1.0, max=1.0))
    assert_agree(_backend.clip(x, xp, min=0.0), xp.clip(x, min=0.0))
    if _backend.is_torch(xp):
        singular = asarray([[1.0, 2.0], [2.0, 4.0]], xp, device)
        assert not np.all(np.isfinite(to_numpy(_backend.inv(singular, xp))))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_inv_of_a_half_precision_matrix_is_taken_in_float32(xp, device, name):
    """No backend inverts float16/bfloat16 matrices (torch: "Low precision dtypes not supported", NumPy:
    "array type float16 is unsupported in linalg"): _backend.inv takes the inverse in float32 and rounds it
    back, so it keeps the input's dtype and equals the float32 inverse of the rounded matrix rounded to that
    dtype, to AGREE_RTOL of the dtype (4e-3 float16, 3e-2 bfloat16)."""
    half = getattr(xp, name, None)
    if half is None:  # NumPy and CuPy have no bfloat16, array-api-strict neither half type
        pytest.skip(f"{xp.__name__} has no {name}")
    A = xp.astype(asarray([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], xp, device), half)
    out = _backend.inv(A, xp)
    assert out.dtype == half
    assert_agree(out, xp.astype(xp.linalg.inv(xp.astype(A, xp.float32)), half))


def test_the_cupy_sign_and_clip_keep_the_array_apis_meaning(monkeypatch):
    """CuPy's own sign maps NaN to 0 and array-api-compat repairs it through a boolean mask (a host wait
    on the GPU); the CuPy paths use where/maximum/minimum instead. Checked with NumPy standing in for
    CuPy (the same functions, the same semantics), since no GPU is needed to check the logic."""
    from geoarray._backend import kernels

    monkeypatch.setitem(sys.modules, "cupy", np)
    x = np.array([np.nan, -3.0, -0.0, 0.0, 2.5])
    np.testing.assert_array_equal(kernels._sign_cupy(x), np.array([np.nan, -1.0, 0.0, 0.0, 1.0]))
    np.testing.assert_array_equal(kernels._sign_cupy(np.array([-2, 0, 5])), np.array([-1, 0, 1]))
    y = np.array([-2.0, -0.5, 0.5, 2.0])
    np.testing.assert_array_equal(kernels._clip_cupy(y, -1.0, 1.0), np.array([-1.0, -0.5, 0.5, 1.0]))
    np.testing.assert_array_equal(kernels._clip_cupy(y, 0.0, None), np.array([0.0, 0.0, 0.5, 2.0]))
    np.testing.assert_array_equal(kernels._clip_cupy(y, None, 0.0), np.array([-2.0, -0.5, 0.0, 0.0]))


def test_fast_path_registry(backend):
    assert _backend.fast_path_backends("expm") == ["jax", "numpy", "torch"]
    assert _backend.fast_path_backends("geqrf") == ["jax", "numpy", "torch"]
    assert _backend.fast_path_backends("triu_inverse") == ["jax", "torch"]
    assert _backend.fast_path_backends("t_factor") == ["jax", "torch"]
    assert _backend.fast_path_backends("addmm") == ["torch"]
    assert _backend.fast_path_backends("lerp") == ["torch"]
    assert _backend.fast_path_backends("matmul") == ["torch"]
    assert _backend.fast_path_backends("split") == ["torch"]
    assert _backend.fast_path_backends("eye") == ["torch"]
    assert _backend.fast_path_backends("norm1") == ["numpy", "torch"]
    assert _backend.fast_path_backends("sign") == ["cupy", "torch"]
    assert _backend.fast_path_backends("clip") == ["cupy"]
    assert _backend.fast_path_backends("solve") == ["torch"]
    assert _backend.fast_path_backends("inv") == ["torch"]
    # expm natives are opt-in (the generic path is the accurate one), geqrf natives are automatic
    assert _backend.fast_path("expm", backend.xp) is None
    assert (_backend.fast_path("geqrf", backend.xp) is None) == (backend.kind not in ("jax", "numpy", "torch"))
    assert _backend.fast_path("expm", backend.xp, "generic") is None
    if backend.kind in ("jax", "numpy", "torch"):
        assert callable(_backend.fast_path("expm", backend.xp, "native"))
    assert _backend.fast_path("no-such-op", backend.xp) is None


def test_addmm_and_lerp_equal_their_generic_forms(xp, device, backend):
    """``addmm`` (C + α·A@B, the addition inside torch's GEMM) and ``lerp`` (a + w(b − a), torch.lerp) equal
    the plain expressions to 1e-14, for 2-D, batched, broadcast and empty operands and for α = 1, −1, 0.3; where
    the fast path declines (C not of the product's shape, e.g. larger than it) the generic form runs. Backends
    without a native kernel run the generic form (NumPy has no GEMM with β, XLA fuses the addition itself)."""
    rng = np.random.default_rng(12)

    def arr(*shape):
        return asarray(rng.standard_normal(shape), xp, device)

    cases = [(arr(9, 4), arr(9, 5), arr(5, 4)), (arr(3, 9, 4), arr(3, 9, 5), arr(3, 5, 4)),
             (arr(2, 3, 9, 4), arr(9, 5), arr(2, 3, 5, 4)), (arr(9, 4), arr(3, 9, 5), arr(3, 5, 4)),
             (arr(0, 9, 4), arr(0, 9, 5), arr(5, 4)), (arr(2, 9, 0), arr(2, 9, 5), arr(2, 5, 0)),
             (arr(3, 9, 4), arr(3, 1, 5), arr(3, 5, 4))]  # fmt: skip
    for C, A, B in cases:
        for alpha in (1.0, -1.0, 0.3):
            assert_close(_backend.addmm(C, A, B, xp, alpha=alpha), C + alpha * (A @ B), xp=xp, atol=1e-14)
    a, b = arr(2, 9, 4), arr(2, 9, 4)
    for w in (0.0, 0.05, 0.95, 1.0):
        assert_close(_backend.lerp(a, b, w, xp), a + w * (b - a), xp=xp, atol=1e-14)
    for w in (0.05, 1.0):  # a 0-d array weight (Adam's bias-corrected factor)
        w_arr = xp.asarray(w, dtype=a.dtype, device=device)
        assert_close(_backend.lerp(a, b, w_arr, xp), a + w * (b - a), xp=xp, atol=1e-14)
    a1 = arr(9, 4)  # broadcast: torch.lerp is declined, the generic form runs
    assert_close(_backend.lerp(a1, b, 0.3, xp), a1 + 0.3 * (b - a1), xp=xp, atol=1e-14)
    native = _backend.fast_path("addmm", xp)
    assert (native is None) == (backend.kind != "torch")


def test_sign_and_host_constants_need_no_copy_from_the_host(xp, device, backend):
    """``_backend.sign`` is the array API's sign (−1, 0, +1, NaN for NaN; torch's own gives 0 for NaN, and
    array-api-compat mends that with a boolean-mask assignment, a synchronisation on a GPU); ``host_constant``
    equals ``asarray`` of the same numbers, is made once per dtype and device (the same array again), and
    on torch neither makes an array from host data (``aten.lift_fresh``: a synchronous copy to a CUDA
    device) nor indexes with a mask."""
    x = xp.asarray([-2.5, -0.0, 0.0, 3.0, float("nan"), float("inf"), -float("inf")], dtype=xp.float64, device=device)
    got = to_numpy(_backend.sign(x, xp))
    np.testing.assert_array_equal(got, [-1.0, 0.0, 0.0, 1.0, np.nan, 1.0, -1.0])
    values = ((1.0, 0.5, 1 / 6), (1 / 24, 1 / 120, 1 / 720))
    like = xp.zeros((2, 2), dtype=xp.float32, device=device)
    made = _backend.host_constant(values, like, xp)
    np.testing.assert_array_equal(to_numpy(made), np.asarray(values, dtype=np.float32))
    assert made.dtype == xp.float32 and made.shape == (2, 3)
    if backend.kind != "jax":  # JAX makes it where it is used (a compiled program's constant)
        assert _backend.host_constant(values, like, xp) is made
    if backend.kind == "torch":
        from torch.utils._python_dispatch import TorchDispatchMode

        seen = []

        class Seen(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(func.__name__.split(".")[0])
                return func(*args, **(kwargs or {}))

        with Seen():
            _backend.sign(x, xp)
            _backend.host_constant(((2.0, 3.0),), xp.zeros((1,), dtype=xp.float64, device=device), xp)
        assert not {"lift_fresh", "lift_fresh_copy", "index_put_", "nonzero"} & set(seen), seen


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_from_host_is_asarray_and_compiles_nothing_on_jax(xp, device, backend, caplog, dtype_name):
    """``_backend.from_host(host, xp, dtype, device)`` equals ``xp.asarray(host, dtype=dtype, device=device)``
    bit for bit (the same conversion) in values, shape, dtype and device, for a NumPy array, a Python scalar
    and nested tuples. On JAX the array is committed to the device as ``asarray``'s is, does not share the
    NumPy input's memory, and making arrays of three new shapes compiles no XLA program (eager
    ``jnp.asarray`` with a device compiled two per shape)."""
    dtype = getattr(xp, dtype_name)
    rng = np.random.default_rng(0)
    hosts = [rng.standard_normal((5, 3)), 0.25, ((1.0, 2.0), (3.0, 4.0))]
    for host in hosts:
        got = _backend.from_host(host, xp, dtype, device)
        want = xp.asarray(host, dtype=dtype, device=device)
        assert got.dtype == dtype and got.shape == want.shape and _backend.device(got) == device
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want))
    if backend.kind != "jax":
        return
    import logging

    import jax

    assert _backend.from_host(hosts[0], xp, dtype, device).committed
    # device_put shares a 64-byte aligned NumPy buffer on the CPU; jnp.asarray copies, and so must from_host
    buf = np.zeros(16)
    start = (-buf.ctypes.data % 64) // buf.itemsize
    source = buf[start : start + 8].reshape(4, 2)
    assert source.ctypes.data % 64 == 0
    kept = _backend.from_host(source, xp, dtype, device)
    source[...] = 7.0
    assert not np.any(to_numpy(kept) == 7.0), "from_host shares its NumPy input's memory"
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        for k in (11, 12, 13):
            _backend.from_host(rng.standard_normal((k, 3)), xp, dtype, device)
    compiled = [r.getMessage()[:90] for r in caplog.records if "XLA compilation" in r.getMessage()]
    assert not compiled, compiled


def test_split_gives_the_consecutive_slices(xp, device, backend):
    """``_backend.split`` (torch: one ``torch.split``) returns the same pieces as slicing, empty ones included."""
    x = asarray(np.arange(12.0), xp, device)
    sizes = [3, 0, 5, 4]
    pieces = _backend.split(x, sizes, xp)
    assert len(pieces) == len(sizes)
    offset = 0
    for piece, size in zip(pieces, sizes, strict=True):
        assert_close(piece, x[offset : offset + size], xp=xp, atol=0)
        offset += size
    assert (_backend.fast_path("split", xp) is None) == (backend.kind != "torch")


def test_norm1_is_the_largest_absolute_column_sum(xp, device, backend):
    """``_backend.norm1`` (NumPy: column sums as a product with a row of ones; torch: its reductions called
    directly) equals max_j Σᵢ |xᵢⱼ| to 1e-14 per matrix of a batch, and is NaN for a NaN entry and inf for an
    infinite one, in its own matrix only."""
    rng = np.random.default_rng(13)
    X_np = rng.standard_normal((2, 3, 5, 4))
    X = asarray(X_np, xp, device)
    expected = np.max(np.sum(np.abs(X_np), axis=-2), axis=-1)
    assert_close(_backend.norm1(X, xp), expected, xp=xp, atol=1e-14)
    X_np[0, 1, 2, 3], X_np[1, 2, 0, 0] = np.nan, -np.inf
    got = to_numpy(_backend.norm1(asarray(X_np, xp, device), xp))
    assert np.isnan(got[0, 1]) and got[1, 2] == np.inf
    finite = np.ones((2, 3), dtype=bool)
    finite[0, 1] = finite[1, 2] = False
    np.testing.assert_allclose(got[finite], expected[finite], atol=1e-14)
    assert (_backend.fast_path("norm1", xp) is None) == (backend.kind not in ("numpy", "torch"))


def test_memoised_lookups_answer_as_before(xp, device, backend):
    """The memoised backend name and real-floating check give the answers of the first (uncached) call,
    and the check still raises for an integer array after a float one was cached."""
    first = _backend.backend_name(xp)
    _backend._BACKEND_NAMES.clear()
    assert _backend.backend_name(xp) == _backend._backend_name(xp) == first == backend.kind
    x = xp.zeros((2,), dtype=xp.float32, device=device)
    for _ in range(2):
        _backend.check_real_floating(x, "x", xp)
        with pytest.raises(TypeError, match="i must have a real floating dtype"):
            _backend.check_real_floating(xp.zeros((2,), dtype=xp.int32, device=device), "i", xp)


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_eye_equals_the_namespace_identity(xp, device, backend, dtype_name):
    """``_backend.eye`` (torch: one ``torch.eye``) equals ``xp.eye`` exactly, square and rectangular, with the
    dtype and device of ``like``."""
    like = xp.zeros((2, 3), dtype=getattr(xp, dtype_name), device=device)
    for n, m in [(4, None), (3, 5), (5, 3), (0, None)]:
        got = _backend.eye(n, m, like, xp)
        assert_close(got, xp.eye(n, m, dtype=like.dtype, device=device), xp=xp, atol=0, device=device, dtype=like.dtype)
    assert (_backend.fast_path("eye", xp) is None) == (backend.kind != "torch")


@pytest.mark.parametrize("policy", ["always", "never"])
def test_select_runs_the_first_branch_whose_threshold_covers_the_value(xp, device, backend, host_reads_policy, policy):
    """``_backend.select``: the first branch i with value ≤ thresholds[i], else (and for NaN) the last;
    eager by a host read, under jax.jit by ``lax.switch`` with the same choices. Without host reads
    (a GPU's default) eager JAX still switches on the device, other backends take the last (general)
    branch: what ``_backend.selects_on_device`` says of the namespace (the retraction reads it to choose
    a fixed route itself)."""
    branches = [lambda x, k=k: x + k for k in range(4)]  # branch k adds k
    thresholds = (0.1, 0.5, 2.0)
    x = xp.zeros((), dtype=xp.float64, device=device)
    cases = [(0.05, 0), (0.1, 0), (0.3, 1), (2.0, 2), (7.0, 3), (float("inf"), 3), (float("nan"), 3)]
    run = lambda v: _backend.select(v, thresholds, branches, x, xp)  # noqa: E731
    host_reads_policy(policy)
    assert _backend.selects_on_device(xp) == (backend.kind == "jax")
    if backend.kind == "jax":
        import jax

        jitted = jax.jit(run)
    for value, expected in cases:
        v = xp.asarray(value, dtype=xp.float64, device=device)
        eager = expected if policy == "always" or _backend.selects_on_device(xp) else len(branches) - 1
        assert float(run(v)) == eager, value
        if backend.kind == "jax":
            assert float(jitted(v)) == expected, value


def test_a_square_frames_retraction_reads_a_value_that_requires_grad_without_a_warning(backend, device):
    """Under torch's autograd (a ManifoldParameter's retraction in a model), exp(A) of a square frame reads
    ‖A‖₁ to choose its Taylor rule: read through ``detach()``, with no torch warning about converting a
    tensor that requires grad, and the retraction's gradient is autograd's (``torch.autograd.gradcheck``,
    float64, its default tolerances: atol 1e-5, rtol 1e-3). Autograd tensors are torch's: other backends
    differentiate by tracing, where nothing is read."""
    if backend.kind != "torch":
        pytest.skip("requires_grad is torch's autograd; the other backends read no traced value to the host")
    import warnings

    import torch

    from geoarray.manifolds.stiefel import StiefelHorizontal

    M = geoarray.Stiefel(4, 4)
    lam = M.global_section(M.random(0, xp=torch, dtype=torch.float64, device=device))
    A = 0.1 * torch.randn(4, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(device)
    A = (A - A.mT).requires_grad_()
    empty = torch.zeros(0, 4, dtype=torch.float64, device=device)

    def retract(A):
        return M.apply_retraction(lam, StiefelHorizontal(A, empty))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Y = retract(A)
    assert float((Y.mT @ Y - torch.eye(4, dtype=torch.float64, device=device)).abs().max().detach()) < 1e-14
    assert torch.autograd.gradcheck(retract, (A,))


def test_matmul_equals_the_operator_for_tall_small_batches(xp, device, backend):
    """``_backend.matmul`` (torch: (Bᵀ Aᵀ)ᵀ for batches of tall small column-major products, faster there)
    equals A @ B to 1e-14 for the shapes of the ViT step (tall, square, wide, 2-D, broadcast batch), and is
    the plain operator on backends without the fast path."""
    rng = np.random.default_rng(14)
    shapes = [((6, 42, 7), (6, 7, 7)), ((6, 14, 14), (6, 14, 7)), ((6, 7, 7), (6, 7, 7)), ((6, 7, 42), (6, 42, 7)),
              ((42, 7), (7, 7)), ((2, 3, 42, 7), (7, 7)), ((6, 80, 40), (6, 40, 40))]  # fmt: skip
    for sa, sb in shapes:
        A, B = (asarray(rng.standard_normal(s), xp, device) for s in (sa, sb))
        assert_close(_backend.matmul(A, B, xp), A @ B, xp=xp, atol=1e-14)
    assert (_backend.fast_path("matmul", xp) is None) == (backend.kind != "torch")


def test_matmul_transposes_only_a_column_major_tall_operand(torch):
    """torch's ``matmul`` fast path computes (Bᵀ Aᵀ)ᵀ only where A is column-major in its matrix axes (LAPACK's
    layout, the packed Householder section's lifts), where that is the faster bmm; a row-major A takes A @ B, as
    (Bᵀ Aᵀ)ᵀ on two transposed views is torch's 10–20× slower CPU bmm (the ViT set's velocity, row-major after
    init's zeros, made whole steps 1.33× slower). Seen by the result: a transposed view or a row-major array,
    equal to A @ B to 1e-14 either way."""
    from geoarray._backend.kernels import _matmul_torch

    rng = np.random.default_rng(15)
    B = torch.as_tensor(rng.standard_normal((6, 7, 7)))
    rows = torch.as_tensor(rng.standard_normal((6, 42, 7)))
    columns = torch.as_tensor(rng.standard_normal((6, 7, 42))).mT  # (6, 42, 7), column-major
    lapack_slice = torch.as_tensor(rng.standard_normal((6, 7, 49))).mT[:, 7:, :]  # rows of a column-major array
    for A, transposed in ((rows, False), (rows[:, 7:, :], False), (columns, True), (lapack_slice, True)):
        out = _matmul_torch(A, B)
        assert float((out - A @ B).abs().max()) < 1e-14
        # (Bᵀ Aᵀ)ᵀ is the transpose of a row-major product; A @ B is row-major itself
        assert out.mT.is_contiguous() == transposed and out.is_contiguous() == (not transposed), A.stride()


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_all_finite_flags_every_kind_of_non_finite_entry(xp, device, dtype_name):
    """``all_finite`` (the optimizers' skip check) and ``all_finite_on_host`` (its eager form, over several
    arrays) are False for one NaN, +inf or −inf anywhere in a batched array, and True for finite arrays
    whose sum overflows (largest finite values of the dtype), and for −0."""
    dtype = getattr(xp, dtype_name)
    rng = np.random.default_rng(4)
    base = rng.standard_normal((3, 9, 5))
    assert bool(_backend.all_finite(asarray(base, xp, device, dtype=dtype), xp))
    big = np.full((3, 9, 5), np.finfo(dtype_name).max)  # Σ overflows to inf; every entry is finite
    assert bool(_backend.all_finite(asarray(big, xp, device, dtype=dtype), xp))
    assert bool(_backend.all_finite(asarray(-0.0 * base, xp, device, dtype=dtype), xp))
    for bad in (np.nan, np.inf, -np.inf):
        for index in [(0, 0, 0), (2, 8, 4), tuple(int(i) for i in rng.integers(0, (3, 9, 5)))]:
            x = base.copy()
            x[index] = bad
            assert not bool(_backend.all_finite(asarray(x, xp, device, dtype=dtype), xp)), (bad, index)
            # the eager optimizers' host read over several groups: the bad entry in the second one
            arrays = [asarray(big, xp, device, dtype=dtype), asarray(x, xp, device, dtype=dtype)]
            assert _backend.all_finite_on_host(arrays, xp) is False, (bad, index)
    assert _backend.all_finite_on_host([asarray(a, xp, device, dtype=dtype) for a in (big, base, -0.0 * base)], xp)


def test_import_geoarray_imports_no_heavy_backend():
    code = "import sys, geoarray; print(','.join(m for m in ('torch', 'jax', 'cupy', 'scipy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_cli_version_and_help(capsys):
    from geoarray import cli

    assert cli.main(["--version"]) == 0
    assert geoarray.__version__ in capsys.readouterr().out
    assert cli.main([]) == 0
    assert "usage: geoarray" in capsys.readouterr().out


def test_mixed_namespaces_in_manifolds_and_optimizers(xp, device, backend):
    """Mixing two array libraries in one call is a TypeError everywhere, not a silent conversion."""
    import geoarray
    from geoarray import optim

    M = geoarray.Stiefel(2, 2)
    Y = asarray(np.eye(2), xp, device)
    other = _other_namespace(backend)
    with pytest.raises(TypeError, match="different array libraries"):
        M.rgrad(Y, other)
    with pytest.raises(TypeError, match="different array libraries"):
        M.metric(Y, other, other)
    opt = optim.Adam()
    state = opt.init({"Y": Y}, {"Y": M})
    with pytest.raises(TypeError, match="different array libraries"):
        opt.update({"Y": Y}, {"Y": other}, state)


def test_static_loop_equals_a_python_loop(xp, device):
    """``static_loop(body, carry, n)`` applies body n times (lax.fori_loop on JAX, a loop elsewhere):
    the same as an explicit loop to 1e-15, for n = 0, 1 and 5, with a tuple carry."""

    def body(k, c):
        a, b = c
        return a * 0.5 + b, b + k

    x = xp.asarray([1.0, -2.0, 3.0], device=device)
    for n in (0, 1, 5):
        got = _backend.static_loop(body, (x, x), n, xp)
        want = (x, x)
        for k in range(n):
            want = body(k, want)
        for g, w in zip(got, want, strict=True):
            assert_close(g, w, xp=xp, atol=1e-15)


def test_autodiff_gradients_and_jacobians_where_the_backend_has_them(backend, xp, device):
    """``value_and_grad`` of f(p) = Σ sin(a)·b² over a dict and ``jacfwd`` of x ↦ x³ (diagonal 3x²) equal
    their closed forms to 1e-14 on torch and JAX; on other backends both raise a ValueError naming the
    backend, and ``vmap_compiled`` is JAX's only (None elsewhere: loop instead)."""
    a = xp.asarray([0.1, -0.7, 1.3], device=device)
    b = xp.asarray([2.0, 0.5, -1.0], device=device)
    f = lambda p: xp.sum(xp.sin(p["a"]) * p["b"] ** 2)  # noqa: E731
    if not _backend.has_autodiff(xp):
        with pytest.raises(ValueError, match="needs PyTorch or JAX arrays"):
            _backend.value_and_grad(f, {"a": a, "b": b}, xp)
        with pytest.raises(ValueError, match="needs PyTorch or JAX arrays"):
            _backend.jacfwd(lambda x: x**3, a, xp)
        assert _backend.vmap_compiled(lambda x: x, xp) is None
        return
    value, grads = _backend.value_and_grad(f, {"a": a, "b": b}, xp)
    assert_close(value, f({"a": a, "b": b}), xp=xp, atol=1e-14)
    assert_close(grads["a"], xp.cos(a) * b**2, xp=xp, atol=1e-14)
    assert_close(grads["b"], 2 * xp.sin(a) * b, xp=xp, atol=1e-14)
    J = _backend.jacfwd(lambda x: x**3, a, xp)
    assert_close(J, linalg.eye(3, J) * (3 * a**2)[None, :], xp=xp, atol=1e-14)
    rows = _backend.vmap_compiled(lambda x: 2 * x, xp)
    assert (rows is None) == (backend.kind != "jax")


def test_householder_section_form_is_decided_by_backend_and_shape(backend, xp):
    """The backend × shape policy of the Householder section lives in _backend: packed reflectors for
    torch batches of ≥ 16 frames with n ≤ 32 on the CPU (eager or compiled: test_optim), the
    block reflector for NumPy's tall frames of ≥ 2¹⁷ entries (N ≥ 8n) and JAX's tall frames of ≥ 2¹⁸ entries
    (N ≥ 12n, 32 ≤ n ≤ 128), the compact-WY form otherwise (each form is checked equal to the others in
    test_manifolds and test_block_reflector)."""
    form = _backend.householder_section_form
    torch, jax, numpy = backend.kind == "torch", backend.kind == "jax", backend.kind == "numpy"
    assert form((16, 49, 7), xp) == ("packed" if torch else "compact-wy")
    if torch:  # not on a GPU, where ormqr's cost grows as if frames were applied one by one
        import torch as torch_module

        assert form((16, 49, 7), xp, torch_module.device("cpu")) == "packed"
        assert form((16, 49, 7), xp, torch_module.device("cuda", 0)) == "compact-wy"
    assert form((15, 49, 7), xp) == "compact-wy"
    assert form((16, 96, 33), xp) == "compact-wy"
    assert form((4096, 128), xp) == ("block-reflector" if jax or numpy else "compact-wy")
    assert form((8, 4096, 128), xp) == ("block-reflector" if numpy or jax else "compact-wy")
    assert form((512, 128), xp) == "compact-wy"  # N < 16n: the QR is as cheap or cheaper
    assert form((512, 64), xp) == "compact-wy"
    assert form((1024, 64), xp) == "compact-wy"  # JAX: below 2¹⁸ entries the QR is as cheap
    assert form((2048, 128), xp) == ("block-reflector" if jax or numpy else "compact-wy")
    assert form((36, 768, 64), xp) == ("block-reflector" if numpy or jax else "compact-wy")  # GPT-2 small's stack
    assert form((2048, 256), xp) == ("block-reflector" if numpy else "compact-wy")  # JAX: n large
    assert form((336, 49, 7), xp) == ("packed" if torch else "compact-wy")  # n small: the QR is cheap
    assert form((1024, 32), xp) == "compact-wy"  # below 2¹⁷ entries: the LU's steps are not carried
    previous = geoarray.set_section_form("block-reflector")
    try:  # a setting wins over the rule
        assert form((16, 49, 7), xp) == form((4096, 128), xp) == "block-reflector"
    finally:
        geoarray.set_section_form(previous)


@pytest.mark.parametrize(
    "shape", [(16, 42, 7), (3, 20, 5), (16, 30, 9), (12, 4)], ids=["fast", "few", "wide", "single"]
)
def test_skew_square_minus_gram_is_the_retractions_lower_block(xp, device, shape):
    """c = a² − BᵀB for a skew a, whatever route the backend takes (torch on the CPU: −[a; B]ᵀ[a; B] in one
    product for batches of ≥ 16 frames with k ≤ 7), equals the two products to 1e-13 (float64, O(1)
    entries); the result is symmetric."""
    *batch, m, k = shape
    g = geoarray.random.normal(0, (*batch, k, k), xp=xp, device=device)
    a = (g - xp.matrix_transpose(g)) / 2
    B = geoarray.random.normal(1, (*batch, m, k), xp=xp, device=device)
    low = _backend.skew_square_minus_gram(a, B, xp)
    assert_close(low, a @ a - xp.matrix_transpose(B) @ B, xp=xp, atol=1e-13)
    assert_close(low, xp.matrix_transpose(low), xp=xp, atol=1e-13)


def test_packed_section_operators_match_their_fake_kernels(backend, xp, device):
    """The packed section's operators (geqrf and ormqr for torch.compile) pass torch's
    ``opcheck``: the fake kernel gives the real one's shapes, dtypes and strides (each matrix column-major,
    as LAPACK makes it), and the schema holds; and they equal torch.geqrf / torch.ormqr exactly (the
    same calls). Batched, a single frame, and an expanded (broadcast) factor as the section passes it."""
    if backend.kind != "torch":
        pytest.skip("custom operators for torch.compile: torch only")
    import torch

    geqrf, ormqr = _backend.torch_packed_ops()
    g = torch.Generator().manual_seed(0)
    for batch in [(16,), (), (2, 3)]:
        A = torch.randn(*batch, 9, 4, generator=g, dtype=torch.float64).to(device)
        X = torch.randn(*batch, 9, 3, generator=g, dtype=torch.float64).to(device)
        torch.library.opcheck(geqrf, (A,))
        a, tau = geqrf(A)
        assert a.mT.is_contiguous()
        ref_a, ref_tau = torch.geqrf(A)
        assert torch.equal(a, ref_a) and torch.equal(tau, ref_tau)
        for transpose in (False, True):
            torch.library.opcheck(ormqr, (a, tau, X, transpose))
            assert torch.equal(ormqr(a, tau, X, transpose), torch.ormqr(a, tau, X, left=True, transpose=transpose))
    a, tau = geqrf(torch.randn(9, 4, generator=g, dtype=torch.float64).to(device))
    X = torch.randn(5, 9, 2, generator=g, dtype=torch.float64).to(device)
    torch.library.opcheck(ormqr, (a.expand(5, 9, 4), tau.expand(5, 4), X, True))


def test_computed_once_is_the_identity_and_a_stored_value_when_compiled(xp, device, backend):
    """``computed_once(x)`` is x itself outside ``torch.compile`` (the same object), on every backend; under
    ``torch.compile`` it returns x's values exactly (a cumulative sum over an axis of length 1), through a
    scan the graph keeps, so that inductor stores the value once instead of inlining its computation into
    every loop that reads it (the bias corrections of Adam, the signs of a section); inductor's own
    kernels then agree with the eager values to 1e-14 (relative)."""
    x = asarray(np.array([[0.25, -1.5], [3.0, np.nan]]), xp, device)
    assert _backend.computed_once(x) is x
    if backend.kind != "torch":
        return
    import torch

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(t, c):
        coefficient = _backend.computed_once((1 - 0.9) / (1 - 0.9 ** (c + 1)))
        return t * coefficient, _backend.computed_once(torch.sign(t))

    torch._dynamo.reset()
    c = torch.tensor(4.0, dtype=x.dtype, device=x.device)
    got = torch.compile(f, backend=record, fullgraph=True)(x, c)
    want = f(x, c)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(torch.nan_to_num(g, nan=7.0), torch.nan_to_num(w, nan=7.0))
        assert torch.equal(torch.isnan(g), torch.isnan(w))
    kept = [node.target for gm in graphs for node in gm.graph.nodes if node.op in ("call_function", "call_method")]
    assert sum(1 for t in kept if "cumsum" in str(t)) == 2, kept
    counts = torch.arange(3, dtype=torch.int32, device=x.device)  # not floating: itself, of its dtype
    assert torch.compile(_backend.computed_once, backend=record, fullgraph=True)(counts).dtype == torch.int32
    fused = torch.compile(f, backend="inductor", fullgraph=True)(x, c)  # its own kernels: to rounding
    for g, w in zip(fused, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-14, atol=0.0, equal_nan=True)


def test_float32_products_are_full_float32(xp, device):
    """The suite's float32 tolerances assume IEEE float32 matrix products; on a GPU, TF32 (JAX's default
    on Ampere and later, 10 mantissa bits) is switched off by tests/_helpers.py. A 256×256 product of
    uniform [0, 1) entries agrees with float64 to 1e-5 relative in every entry: measured on the CPU
    9.1e-7 in float32, 1.0e-4 with the inputs rounded to TF32's 10 mantissa bits (numpy emulation)."""
    rng = np.random.default_rng(0)
    a, b = rng.random((256, 256)), rng.random((256, 256))
    product = to_numpy(asarray(a, xp, device, "float32") @ asarray(b, xp, device, "float32"))
    exact = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    assert np.max(np.abs(product - exact) / exact) <= 1e-5


def test_backend_predicates_agree_with_array_api_compat():
    """geoarray's ``is_*`` predicates (a table of module names, because array_api_compat's are
    ``lru_cache`` wrappers that torch.compile warns about) answer as array_api_compat's do, on every name
    either one knows and on near misses."""
    import types

    import array_api_compat as compat

    from geoarray._backend import namespace

    pairs = {
        "numpy": (_backend.is_numpy, compat.is_numpy_namespace),
        "torch": (_backend.is_torch, compat.is_torch_namespace),
        "jax": (_backend.is_jax, compat.is_jax_namespace),
        "cupy": (_backend.is_cupy, compat.is_cupy_namespace),
        "array_api_strict": (_backend.is_array_api_strict, compat.is_array_api_strict_namespace),
    }
    names = set().union(*namespace._NAMESPACE_NAMES.values())
    names |= {"jax", "numpy.linalg", "torch.linalg", "array_api_compat", "array_api_compat.dask.array", "dask.array"}
    for name in sorted(names):
        module = types.ModuleType(name)
        for backend_name, (ours, theirs) in pairs.items():
            assert ours(module) == theirs(module), (name, backend_name)
    assert not _backend.is_torch(object()) and not _backend.is_numpy(types.SimpleNamespace(__name__=["numpy"]))


def test_subclasses_of_an_array_type_take_its_namespace_without_array_api_compat(monkeypatch):
    """Once torch.Tensor's namespace is known (``as_namespace(torch)``, which importing geoarray.torch
    does), a Parameter, a ManifoldParameter and a Tensor resolve together to it from geoarray's own table,
    as array_api_compat resolves them (a subclass as its base): under torch.compile the compat route is an
    ``lru_cache`` wrapper. Mixed libraries still raise ``TypeError`` naming both."""
    torch = pytest.importorskip("torch", reason="the subclasses here are torch's")
    gt = pytest.importorskip("geoarray.torch")
    import array_api_compat as compat

    expected = _backend.as_namespace(torch)
    M = geoarray.Stiefel(4, 2)
    W = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64), M)
    b = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    x = torch.ones(3, 4, dtype=torch.float64)

    def refuse(*args, **kwargs):
        raise AssertionError("array_api_compat.array_namespace was consulted")

    monkeypatch.setattr(compat, "array_namespace", refuse)
    assert _backend.array_namespace(x, W=W, b=b) is expected
    assert _backend.array_namespace(W) is expected
    monkeypatch.undo()
    assert compat.array_namespace(x, W, b) is expected
    with pytest.raises(TypeError, match="different array libraries"):
        _backend.array_namespace(W, np.ones(2))


def test_every_backends_arrays_take_their_namespace_from_geoarrays_table(xp, device, backend, monkeypatch):
    """The namespace of a NumPy, torch or CuPy array, an array_api_strict.Array and a JAX array depends on
    its type alone: once array_api_compat has resolved one array of a type, the next resolve from geoarray's
    table (array_api_compat's ``__array_namespace__`` call costs ≈ 20 µs on array-api-strict, where the
    optimizers ask a few dozen times per step), equal to array_api_compat's answer; on JAX a tracer inside
    ``jax.jit`` too. Arrays of two libraries still raise ``TypeError`` naming both."""
    import array_api_compat as compat

    x = xp.ones((2, 3), device=device)
    expected = compat.array_namespace(x)
    assert _backend.array_namespace(x) is expected  # may consult array_api_compat once, and remember the type

    def refuse(*args, **kwargs):
        raise AssertionError("array_api_compat.array_namespace was consulted")

    monkeypatch.setattr(compat, "array_namespace", refuse)
    assert _backend.array_namespace(xp.zeros((4,), device=device), y=x) is expected
    monkeypatch.undo()
    if backend.kind == "jax":
        import jax

        seen = []
        jax.jit(lambda t: seen.append(_backend.array_namespace(t)) or t)(x)  # a tracer: its namespace, once
        monkeypatch.setattr(compat, "array_namespace", refuse)
        jax.jit(lambda t: seen.append(_backend.array_namespace(t, x)) or t)(x + 1)
        monkeypatch.undo()
        assert seen == [expected, expected]
    if backend.kind != "numpy":
        with pytest.raises(TypeError, match="different array libraries"):
            _backend.array_namespace(x, np.ones(2))


@pytest.mark.parametrize("c", [0.5, 1.0 / 6.0, -2.0])
def test_plus_identity_is_the_sum_with_c_times_the_identity(xp, device, c):
    """``_backend.plus_identity(P, c, I, xp)`` (torch: one ``add`` with ``alpha``) equals ``P + c·I`` bit for
    bit: c·I is exact (entries c and 0), so the fused form rounds only the sum. Unbatched and batched P
    (the identity broadcasts), float32 and float64."""
    rng = np.random.default_rng(3)
    for dtype in (xp.float32, xp.float64):
        for shape in [(5, 5), (3, 5, 5)]:
            P = xp.asarray(rng.standard_normal(shape), dtype=dtype, device=device)
            eye = linalg.eye(5, P)
            got, want = _backend.plus_identity(P, c, eye, xp), P + c * eye
            assert got.dtype == dtype and tuple(got.shape) == shape
            assert np.array_equal(to_numpy(got), to_numpy(want))


def test_where_equals_the_namespaces_where(xp, device):
    """``_backend.where(c, a, b, xp)`` (torch: ``torch.where`` without array_api_compat's promotion step when a
    and b share a dtype) equals ``xp.where`` bit for bit: same dtypes (float32, float64, with a broadcast 0-d
    condition and a full one) and, through the namespace's own where, mixed ones."""
    rng = np.random.default_rng(5)
    for dtype in (xp.float32, xp.float64):
        a = xp.asarray(rng.standard_normal((3, 4)), dtype=dtype, device=device)
        b = xp.asarray(rng.standard_normal((3, 4)), dtype=dtype, device=device)
        for c in (xp.asarray(True, device=device), xp.asarray(False, device=device), a > b):
            got, want = _backend.where(c, a, b, xp), xp.where(c, a, b)
            assert got.dtype == dtype
            assert np.array_equal(to_numpy(got), to_numpy(want))
    a32 = xp.asarray(rng.standard_normal((2, 2)), dtype=xp.float32, device=device)
    b64 = xp.asarray(rng.standard_normal((2, 2)), dtype=xp.float64, device=device)
    c = a32 > 0
    got, want = _backend.where(c, a32, b64, xp), xp.where(c, a32, b64)
    assert got.dtype == want.dtype == xp.float64
    assert np.array_equal(to_numpy(got), to_numpy(want))


def test_tree_leaves_and_like_tree_are_optrees(xp, device):
    """``_backend.tree_leaves`` and ``_backend.like_tree`` are ``optree.tree_leaves`` and the unflattening by
    a tree's structure, for a flat list and tuple of arrays, a dict, nested containers and None (no leaf).
    Under ``torch.compile`` (torch only) a flat list or tuple of tensors takes a path without optree's
    polyfills: the compiled function equals the eager one and is one graph."""
    import optree

    a = xp.asarray([1.0, 2.0], device=device)
    b = xp.asarray([[3.0]], device=device)
    trees = [[a, b], (a, b), {"x": a, "y": [b, None]}, [a, (b,)], [None, a]]
    for tree in trees:
        leaves = _backend.tree_leaves(tree)
        assert len(leaves) == len(optree.tree_leaves(tree))
        assert all(x is y for x, y in zip(leaves, optree.tree_leaves(tree), strict=True))
        doubled = [2 * x for x in leaves]
        rebuilt = _backend.like_tree(tree, doubled)
        assert optree.tree_structure(rebuilt) == optree.tree_structure(tree)
        assert all(x is y for x, y in zip(optree.tree_leaves(rebuilt), doubled, strict=True))
    if _backend.backend_name(xp) != "torch":
        return
    import torch

    def f(tree):
        return _backend.like_tree(tree, [x + 1 for x in _backend.tree_leaves(tree)])

    for tree in ([a, b], (a, b)):
        compiled = torch.compile(f, fullgraph=True, backend="eager")
        got, want = compiled(tree), f(tree)
        assert type(got) is type(tree)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))


def test_small_identities_under_torch_compile_are_the_identity(xp, device, backend):
    """Under ``torch.compile`` an identity of fewer than 33 rows and columns enters the graph as a constant
    built by list arithmetic (a 1 and m zeros, min(n, m) times, cut or padded to n·m) instead of
    ``torch.eye``: square, wide, tall (also taller than m + 1, where the pattern is padded), empty, and the
    largest constant size, float32 and float64, each equal to ``torch.eye`` bit for bit; from 33 rows on,
    ``torch.eye`` itself. torch only: the constant exists for inductor's loops."""
    if backend.kind != "torch":
        pytest.skip("the identity as a graph constant is torch.compile's (kernels._eye_torch)")
    import torch
    import torch._dynamo

    shapes = [(1, 1), (4, 4), (2, 5), (5, 2), (6, 1), (0, 3), (3, 0), (32, 32), (33, 4)]
    like32 = xp.zeros((1,), dtype=xp.float32, device=device)

    def identities(like):
        return [_backend.eye(n, m, like, xp) for n, m in shapes]

    torch._dynamo.reset()
    compiled = torch.compile(identities, fullgraph=True, backend="eager")
    for like in (like32, xp.astype(like32, xp.float64)):
        for (n, m), got in zip(shapes, compiled(like), strict=True):
            want = torch.eye(n, m, dtype=like.dtype, device=like.device)
            assert got.dtype == like.dtype and tuple(got.shape) == (n, m)
            assert torch.equal(got, want), (n, m)

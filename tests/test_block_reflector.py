"""The GEMM-only route of the Householder section (issue #52): Q = I − W M Wᵀ with W = Y − E·S.

``geoarray.linalg.householder_block_reflector`` builds Householder's Q of an orthonormal frame from matrix
products and elementwise operations only, and ``BlockReflectorSection`` applies it
(``geoarray.set_section_form("block-reflector")``). Checked here on every backend:

* the factors: Q equals the Q of a Householder QR of Y (geqrf's, or the generic one) to 1e-13 in
  float64, including frames whose columns geqrf leaves unreflected, and is orthogonal even for a drifted Y;
* the section: every operation (λX, λᵀD, Q⊥X, Q⊥ᵀD) equals the compact-WY section's, and whole optimizer
  steps with the route equal steps with the default route to 1e-12 (float64) on Stiefel and Grassmann;
* the route itself: a whole Adam step calls no QR, LU, triangular solve, inverse, Cholesky, eigen- or
  singular value decomposition (torch: a dispatch mode sees every aten operation; JAX: the jaxpr's
  primitives; NumPy and array-api-strict: numpy.linalg's factorisations replaced by functions that fail);
  an eager torch step on it reads nothing to the host, and ``torch.compile`` traces it in one graph.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import geoarray
from _helpers import assert_close, host_waits, max_abs, to_numpy
from geoarray import linalg, optim
from geoarray.linalg.householder import _triu_inverse_by_products
from geoarray.manifolds import BlockReflectorSection, Grassmann, HouseholderSection, Stiefel

# aten operations of a factorisation or a solve (names without their overload); "linalg_*" are all of them
FACTORISATIONS = {
    "geqrf", "ormqr", "orgqr", "triangular_solve", "cholesky", "cholesky_solve", "cholesky_inverse", "lu_solve",
    "lu_unpack", "inverse", "svd", "qr", "eig", "symeig", "lstsq",
}  # fmt: skip
# JAX primitives of the same (jax.lax.linalg and its LAPACK lowerings)
JAX_FACTORISATIONS = {
    "lu", "lu_pivots_to_permutation", "triangular_solve", "qr", "geqrf", "geqp3", "householder_product",
    "cholesky", "eig", "eigh", "svd", "schur", "hessenberg", "tridiagonal", "tridiagonal_solve", "custom_linear_solve",
}  # fmt: skip
NUMPY_FACTORISATIONS = ("qr", "solve", "inv", "cholesky", "eig", "eigh", "eigvals", "eigvalsh", "svd", "lstsq", "pinv")


@contextlib.contextmanager
def section_form(form: str):
    previous = geoarray.set_section_form(form)
    try:
        yield
    finally:
        geoarray.set_section_form(previous)


def _q(Y, W_M_signs, xp):
    """The dense Q = I − W M Wᵀ, W = Y − E·S (for checks only)."""
    M, signs = W_M_signs
    n = Y.shape[-1]
    top = Y[..., :n, :] - signs[..., None, :] * linalg.eye(n, Y)
    W = xp.concat([top, Y[..., n:, :]], axis=-2)
    return linalg.eye(Y.shape[-2], Y) - W @ M @ xp.matrix_transpose(W)


def _householder_q(Y, xp):
    qr = linalg.householder_qr(Y)
    return linalg.eye(Y.shape[-2], Y) - qr.V @ qr.T @ xp.matrix_transpose(qr.V), xp.linalg.diagonal(qr.R)


@pytest.mark.parametrize("shape", [(4, 40, 5), (3, 10, 3), (2, 7, 1), (96, 8), (2, 50, 13), (2, 6, 5)])
def test_the_block_reflector_is_householders_q(xp, device, shape):
    """Q = I − W M Wᵀ equals the Householder QR's Q to 1e-13 (float64), is orthogonal to 1e-13, and Q·E·S = Y,
    with S = sign(diag R) of the QR (frames of 1 to 13 columns, batched and single, n odd and N = n + 1)."""
    *batch, N, n = shape
    Y = Stiefel(N, n).random(0, xp=xp, batch_shape=tuple(batch), device=device)
    br = linalg.householder_block_reflector(Y)
    Q = _q(Y, br, xp)
    Q_ref, r_diag = _householder_q(Y, xp)
    assert_close(Q, Q_ref, xp=xp, atol=1e-13)
    assert_close(br.signs, xp.sign(r_diag), xp=xp, atol=0)
    assert max_abs(xp.matrix_transpose(Q) @ Q - linalg.eye(N, Y)) < 1e-13
    assert_close(Q[..., :n] * br.signs[..., None, :], Y, xp=xp, atol=1e-13)


def test_the_block_reflector_is_householders_q_in_float32(xp, device):
    """In float32 Q equals the float64 Householder Q to 2e-5 and is orthogonal to 2e-6 (N = 96, n = 8)."""
    Y64 = Stiefel(96, 8).random(0, xp=xp, batch_shape=(3,), device=device)
    Y = xp.astype(Y64, xp.float32)
    Q = _q(Y, linalg.householder_block_reflector(Y), xp)
    assert_close(xp.astype(Q, xp.float64), _householder_q(Y64, xp)[0], xp=xp, atol=2e-5)
    assert max_abs(xp.matrix_transpose(Q) @ Q - linalg.eye(96, Y)) < 2e-6


@pytest.mark.parametrize("columns", [[0, 1, 2], [3, 0, 5], [5, 4, 3], [1, 0, 2]])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_frames_that_geqrf_leaves_unreflected_get_the_same_section(xp, device, columns, sign):
    """Columns of the identity (±eₖ, in any order): geqrf leaves a column that is already reduced unreflected
    (τₖ = 0) where this route reflects it, which flips that column of Q only; S flips it back, so λ = Q·diag(S, I)
    has Householder's Q⊥ exactly and λE = Y. The zeros are +0.0: for a pivot of −0.0 LAPACKs differ (MKL, under
    torch, takes it as +0, as this route does; OpenBLAS's, under NumPy and JAX, takes its sign), and so do their
    sections, each valid: with −0.0 the check is λE = Y and Q orthogonal."""
    for zeros in (0.0, -0.0):
        Y = xp.asarray(sign * np.eye(6)[:, columns] + zeros, device=device)
        br = linalg.householder_block_reflector(Y)
        Q, Q_ref = _q(Y, br, xp), _householder_q(Y, xp)[0]
        if zeros == 0.0 and not np.signbit(zeros):
            assert_close(Q[..., 3:], Q_ref[..., 3:], xp=xp, atol=1e-15)
        assert_close(Q[..., :3] * br.signs[..., None, :], Y, xp=xp, atol=1e-15)
        assert max_abs(xp.matrix_transpose(Q) @ Q - linalg.eye(6, Y)) < 1e-15


@pytest.mark.parametrize("drift", [1e-7, 1e-4])
def test_a_drifted_frame_still_gets_an_orthogonal_q(xp, device, drift):
    """From a Y with |YᵀY − I| ≈ ``drift``, Q is orthogonal to 1e-13 (the refinement makes C + Cᵀ = WᵀW; without
    it the error would be the drift's size) and Q·E·S is Y to the drift's size, as for a QR of Y."""
    Y = Stiefel(30, 4).random(0, xp=xp, batch_shape=(2,), device=device)
    Y = Y + drift * geoarray.random.normal(1, (2, 30, 4), xp=xp, device=device)
    assert max_abs(xp.matrix_transpose(Y) @ Y - linalg.eye(4, Y)) > drift / 10
    br = linalg.householder_block_reflector(Y)
    Q = _q(Y, br, xp)
    assert max_abs(xp.matrix_transpose(Q) @ Q - linalg.eye(30, Y)) < 1e-13
    assert max_abs(Q[..., :4] * br.signs[..., None, :] - Y) < 10 * drift


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13, 64])
@pytest.mark.parametrize("unit", [True, False])
def test_the_triangular_inverse_by_products(xp, device, n, unit):
    """X from ⌈log₂ n⌉ doublings of products is upper triangular and U·X = I within trtri's bound,
    n·ε·‖U‖∞‖X‖∞, for U upper triangular with entries of magnitude ≤ 1 above a diagonal of magnitude ≥ 1
    (the signed LU's factors; random such U at n = 64 have ‖U⁻¹‖ up to about 1e4, so the bound, not a fixed
    tolerance, is the test); and X equals NumPy's inverse to 1e-10 relative to ‖X‖."""
    rng = np.random.default_rng(n)
    U = np.triu(rng.uniform(-1, 1, (3, n, n)), 1)
    U += np.eye(n) * (1.0 if unit else rng.choice([-1, 1], (3, 1, n)) * (1 + rng.uniform(0, 1, (3, 1, n))))
    X = np.asarray(to_numpy(_triu_inverse_by_products(xp.asarray(U, device=device), xp)))
    assert np.all(np.tril(X, -1) == 0)  # no rounding below the diagonal
    norm_inf = lambda A: np.abs(A).sum(axis=-1).max()  # noqa: E731
    for u, x in zip(U, X, strict=True):
        bound = n * np.finfo(np.float64).eps * norm_inf(u) * norm_inf(x)
        assert np.abs(u @ x - np.eye(n)).max() <= bound
        assert np.abs(x - np.linalg.inv(u)).max() <= 1e-10 * np.abs(x).max()


def test_block_reflector_refuses_a_wide_frame(xp, device):
    Y = xp.zeros((3, 5), device=device)
    with pytest.raises(ValueError, match=r"tall.*\(3, 5\)"):
        linalg.householder_block_reflector(Y)


def test_the_section_form_setting_is_validated_and_chosen(xp, device, backend):
    """``set_section_form`` returns the previous setting and refuses an unknown form naming the choices;
    the packed form on a backend other than torch is refused when a section is built, naming the fix."""
    M = Stiefel(12, 3)
    Y = M.random(0, xp=xp, batch_shape=(2,), device=device)
    with pytest.raises(ValueError, match=r"section form must be one of 'auto'.*got 'gemm'"):
        geoarray.set_section_form("gemm")
    assert geoarray.get_section_form() == "auto"
    with section_form("block-reflector"):
        assert geoarray.get_section_form() == "block-reflector"
        assert isinstance(M.global_section(Y), BlockReflectorSection)
    with section_form("compact-wy"):
        assert isinstance(M.global_section(Y), HouseholderSection)
    if backend.kind != "torch":
        with section_form("packed"), pytest.raises(ValueError, match=r"'packed' is torch's.*set_section_form"):
            M.global_section(Y)


@pytest.mark.parametrize("kind", [Stiefel, Grassmann])
def test_the_block_reflector_section_equals_the_compact_wy_section(xp, device, kind):
    """Every operation of the section (λX, λᵀD, Q⊥ᵀD, Q⊥X) equals the compact-WY section's to 1e-13 (float64),
    and so does the retracted point of a lifted gradient."""
    M = kind(40, 5)
    Y = M.random(0, xp=xp, batch_shape=(3,), device=device)
    with section_form("block-reflector"):
        br = M.global_section(Y)
    wy = HouseholderSection.of(Y)
    assert isinstance(br, BlockReflectorSection)
    X = geoarray.random.normal(1, (3, 40, 4), xp=xp, device=device)
    for op in ("apply", "coords", "perp_t"):
        assert_close(getattr(br, op)(X), getattr(wy, op)(X), xp=xp, atol=1e-13)
    assert_close(br.perp(X[..., 5:, :]), wy.perp(X[..., 5:, :]), xp=xp, atol=1e-13)
    G = geoarray.random.normal(2, (3, 40, 5), xp=xp, device=device)
    steps = [M.apply_section(lam, M.retraction(0.1 * M.lift(Y, lam, G))) for lam in (br, wy)]
    assert_close(steps[0], steps[1], xp=xp, atol=1e-13)


@pytest.mark.parametrize(
    "make",
    [
        lambda: optim.Adam(lr=1e-2),
        lambda: optim.Momentum(lr=1e-2),
        lambda: optim.Adam(lr=1e-2, section="rotated"),
        lambda: optim.Adam(lr=1e-2, section="transported"),
    ],
    ids=["Adam", "Momentum", "Adam-rotated", "Adam-transported"],
)
def test_steps_on_the_route_equal_the_default_steps(xp, device, make):
    """Five optimizer steps on a Stiefel stack, a Grassmann point and a Euclidean leaf, with the block-reflector
    section and with the backend's default form, agree to 1e-12 (float64): the same section, built otherwise
    (for "transported", the initial frame; "rotated" re-expresses the moments through both sections)."""
    mans = [Stiefel(24, 4), Grassmann(9, 2), geoarray.Euclidean()]
    params0 = [
        mans[0].random(0, xp=xp, batch_shape=(3,), device=device),
        mans[1].random(1, xp=xp, device=device),
        geoarray.random.normal(2, (5,), xp=xp, device=device),
    ]
    results = []
    for form in ("block-reflector", "auto"):
        with section_form(form):
            opt = make()
            params, state = list(params0), opt.init(list(params0), mans)
            for t in range(5):
                grads = [geoarray.random.normal(10 + t, tuple(p.shape), xp=xp, device=device) for p in params0]
                params, state = opt.update(params, grads, state)
        results.append(params)
    for a, b in zip(*results, strict=True):
        assert_close(a, b, xp=xp, atol=1e-12)


def _step_on_the_route(xp, device, dtype_name="float64"):
    """(a function that takes a second Adam step, its arguments) on a Stiefel stack, the route forced."""
    dtype = getattr(xp, dtype_name)
    M = Stiefel(40, 5)
    Y = M.random(0, xp=xp, batch_shape=(3,), device=device, dtype=dtype)
    G = geoarray.random.normal(1, (3, 40, 5), xp=xp, device=device, dtype=dtype)
    opt = optim.Adam(lr=1e-2)
    params, state = opt.update([Y], [G], opt.init([Y], [M]))
    return opt.update, (params, [G], state)


def test_a_step_on_the_route_calls_no_factorisation(backend, xp, device, monkeypatch):
    """A whole Adam step (section, lift, Adam, retraction, float32 Björck step included) with
    ``set_section_form("block-reflector")`` calls no QR, LU, triangular solve, inverse, Cholesky, eigen- or
    singular value decomposition: matrix products and elementwise operations only. The same check sees the
    default route's QR (torch's geqrf, NumPy's qr, JAX's geqrf primitive), so it can fail; array-api-strict's
    default QR is the generic one, made of rank-one updates."""
    if backend.kind == "torch":
        from torch.utils._python_dispatch import TorchDispatchMode

        def factorisations(fn):
            seen = set()

            class Record(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    name = func.__name__.split(".")[0].lstrip("_")
                    if "linalg" in name or name in FACTORISATIONS:
                        seen.add(name)
                    return func(*args, **(kwargs or {}))

            with Record():
                fn()
            return seen

    elif backend.kind == "jax":
        import jax

        def primitives(jaxpr, seen):
            for eqn in jaxpr.eqns:
                seen.add(eqn.primitive.name)
                for value in eqn.params.values():
                    for sub in value if isinstance(value, (tuple, list)) else (value,):
                        inner = getattr(sub, "jaxpr", sub)
                        if hasattr(inner, "eqns"):
                            primitives(inner, seen)
            return seen

        def factorisations(fn):
            update, args = fn
            return primitives(jax.make_jaxpr(update)(*args).jaxpr, set()) & JAX_FACTORISATIONS

    else:  # NumPy and array-api-strict (which calls numpy.linalg): every factorisation fails when called
        seen = set()

        def failing(name):
            def call(*args, **kwargs):
                seen.add(name)
                raise AssertionError(f"numpy.linalg.{name} called on the GEMM-only route")

            return call

        def factorisations(fn):
            seen.clear()
            with monkeypatch.context() as m:
                for name in NUMPY_FACTORISATIONS:
                    m.setattr(np.linalg, name, failing(name))
                try:
                    fn()
                except AssertionError:
                    pass
            return set(seen)

    for dtype_name in ("float64", "float32"):
        with section_form("block-reflector"):
            update, args = _step_on_the_route(xp, device, dtype_name)
            found = factorisations((update, args) if backend.kind == "jax" else lambda: update(*args))  # noqa: B023
        assert not found, f"{dtype_name}: the GEMM-only route called {sorted(found)}"
    if backend.kind != "array_api_strict":  # the check sees the QR of the default route (strict's is generic)
        with section_form("compact-wy"):
            update, args = _step_on_the_route(xp, device)
            assert factorisations((update, args) if backend.kind == "jax" else lambda: update(*args))


def test_a_step_on_the_route_reads_nothing_to_the_host(backend, xp, device, host_reads_policy):
    """With host reads off (a GPU's default), a step on the route makes the host wait for nothing: the signed
    LU's signs are chosen by ``where`` on the device, in float64 and float32. torch eager: a dispatch mode
    counts reads, host-made arrays and data-dependent shapes (none); JAX: the jitted step holds no callback
    and runs under ``jax.transfer_guard("disallow")``."""
    if backend.kind not in ("torch", "jax"):
        pytest.skip(
            f"{backend.name} arrays live in host memory: there is no device for a step to wait for (the "
            "array-api-strict session runs every test here with host reads 'never')"
        )
    host_reads_policy("never")
    for dtype_name in ("float64", "float32"):
        with section_form("block-reflector"):
            update, args = _step_on_the_route(xp, device, dtype_name)
            if backend.kind == "torch":
                waits, _ = host_waits(lambda: update(*args))  # noqa: B023
                assert not waits, f"{dtype_name}: {waits}"
                continue
            import jax

            jaxpr = str(jax.make_jaxpr(update)(*args))
            assert not any(p in jaxpr for p in ("callback", "io_callback", "pure_callback")), dtype_name
            step = jax.jit(update)
            jax.block_until_ready(step(*args))  # compile outside the guard
            with jax.transfer_guard("disallow"):
                new, _ = jax.block_until_ready(step(*args))
            assert max_abs(new[0] - args[0][0]) > 1e-4  # the step moved the point


def test_torch_compile_traces_the_route_in_one_graph(backend, xp, device):
    """``torch.compile(fullgraph=True)`` of a step on the route (the signed LU's writes into a fresh array
    included) equals the eager step to 1e-12 (float64)."""
    if backend.kind != "torch":
        pytest.skip("torch.compile is torch's")
    import torch._dynamo

    torch._dynamo.reset()
    with section_form("block-reflector"):
        update, args = _step_on_the_route(xp, device)
        eager = update(*args)[0]
        compiled = torch.compile(update, fullgraph=True, backend="aot_eager")(*args)[0]
    assert_close(compiled[0], eager[0], xp=xp, atol=1e-12)

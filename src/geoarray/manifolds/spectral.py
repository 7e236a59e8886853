"""Steepest-descent directions under the spectral norm on the Stiefel and Grassmann manifolds.

For a point Y (..., N, n) with orthonormal columns and a Euclidean gradient (or momentum) G, the
spectral steepest direction is

    A* = argmax ⟨G, A⟩   subject to   ‖A‖₂ ≤ 1  and  A tangent at Y,

the step of Muon (Jordan et al., "Muon: an optimizer for hidden layers in neural networks", 2024)
constrained to the manifold (J. Bernstein, "Modular Manifolds", Thinking Machines Lab, 2025;
J. Su, "Steepest descent on manifolds"; Li et al., "Intrinsic Muon: spectral optimization on
Riemannian matrix manifolds"). The update is then a retraction of Y − lr·A*.

Stiefel (tangent: YᵀA + AᵀY = 0). Write G = Y(YᵀG) + (G − YYᵀG) and take the thin QR
G − YYᵀG = QR. Every competitor can be restricted to span[Y Q] (the rest of the space does not
change the objective and only enlarges ‖A‖₂), A = [Y Q] W with W = [W₁; W₂], W₁ skew, and with
K = skew(YᵀG) and any symmetric P,

    ⟨G, A⟩ = ⟨[K + P; R], W⟩ ≤ ‖[K + P; R]‖_* · ‖W‖₂              (weak duality).

So the dual problem is min over symmetric P of f(P) = ‖[K + P; R]‖_* (the compressed form of
min_P ‖G + 2YP‖_*), with gradient ∇f(P) = sym(W₁(P)) for W(P) = msign([K + P; R]), and at the
minimiser W(P*) has a skew top block, so A* = [Y Q]·msign([K + P*; R]) attains the bound. The
cost is O(N·n²) once and O(n³) per dual iteration (one n×n ``eigh``).

Neither Q nor R is formed: R enters only through RᵀR = G⊥ᵀG⊥ (G⊥ = G − YYᵀG), the Gram matrix
of M is (K + P)ᵀ(K + P) + RᵀR, msign(M) = M·H with H = (MᵀM)^{-1/2}, and Q·(R H) = G⊥·H. This
replaces the QR (5 ms for 4096×128 in torch float32 — as much as a whole ``torch.optim.Muon``
step) by one n×n Gram product; both square the conditioning of G⊥ in the same way, since the
eigen-decomposition of MᵀM is formed in either case.

Grassmann (horizontal: YᵀA = 0): A* = msign((I − YYᵀ)G) in closed form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _backend, linalg
from .._backend import array_namespace, check_real_floating

__all__ = [
    "grassmann_spectral_direction",
    "stiefel_spectral_direction",
    "stiefel_spectral_dual",
    "stiefel_spectral_step",
]

from .._typing import Array


def _check(Y: Array, G: Array, P0: Array | None = None) -> Any:
    for name, a in (("Y", Y), ("G", G)):  # array_namespace passes None over (it is P0's "not given")
        if a is None:
            raise TypeError(f"{name} must be an array, got None")
    xp = array_namespace(Y=Y, G=G, P0=P0)
    check_real_floating(Y, "Y", xp)
    check_real_floating(G, "G", xp)
    if Y.ndim < 2:
        raise ValueError(f"Y must have at least 2 dimensions (..., N, n), got shape {tuple(Y.shape)}")
    N, n = Y.shape[-2:]
    if n > N:
        raise ValueError(f"Y must be tall (N ≥ n) to hold orthonormal columns, got shape {tuple(Y.shape)}")
    if G.shape[-2:] != (N, n):
        raise ValueError(f"G must end in ({N}, {n}) to match Y {tuple(Y.shape)}, got {tuple(G.shape)}")
    if G.dtype != Y.dtype:
        raise TypeError(f"G must have the dtype of Y ({Y.dtype}), got {G.dtype}")
    if P0 is not None:
        check_real_floating(P0, "P0", xp)
        if P0.shape[-2:] != (n, n):
            raise ValueError(f"P0 must end in ({n}, {n}) (a symmetric dual variable), got {tuple(P0.shape)}")
    return xp


def _grams(Y: Array, G: Array, xp: Any) -> tuple[Array, ...]:
    # The pieces every Stiefel routine needs: YᵀG, K = skew(YᵀG), G⊥ = G − Y·YᵀG and
    # C = G⊥ᵀG⊥ = RᵀR (R of the thin QR G⊥ = QR). C is the Gram matrix of the *rounded* G⊥ that the
    # direction and the step then multiply, so the polar factor assembled from it is orthonormal to
    # rounding even where G lies almost inside span Y (expanding C = GᵀG − (YᵀG)ᵀ(2I − YᵀY)(YᵀG) would
    # save the N×n temporary and one product but cancels: max|YᵀY − I| = 1.7e-12 on the float64 Brockett
    # test of tests/test_muon.py, whose bound is 1e-12).
    mT = xp.matrix_transpose
    YtG = mT(Y) @ G
    Gp = _backend.addmm(G, Y, YtG, xp, alpha=-1.0)
    C = mT(Gp) @ Gp
    return YtG, (YtG - mT(YtG)) / 2, Gp, (C + mT(C)) / 2


def _compress(Y: Array, G: Array, xp: Any) -> tuple[Array, Array, Array]:
    # K = skew(YᵀG), G⊥ and C = G⊥ᵀG⊥ (see _grams)
    _, K, Gp, C = _grams(Y, G, xp)
    return K, Gp, C


def _inv_sqrt_psd(gram: Array, xp: Any) -> tuple[Array, Array]:
    # H = gram^{-1/2} on the range (zero on the numerical null space: eigenvalues ≤ k·ε·λ_max, the
    # cut-off of linalg.msign), and the eigenvalues λ (ascending; the squared singular values when
    # gram = MᵀM). ``gram`` is symmetric by construction; eigh reads one triangle (LAPACK) or
    # symmetrises itself (JAX), so it is not re-symmetrised here.
    lam, V = xp.linalg.eigh(gram)
    # cut-off λ are replaced by 1 before the square root, so no 1/0 is evaluated (gram = 0 has λ = 0 and
    # a cut-off of 0: NumPy would warn, and autodiff through where would meet the inf)
    tiny = gram.shape[-1] * xp.finfo(gram.dtype).eps * _backend.clip(lam[..., -1:], xp, min=0.0)
    keep = lam > tiny
    inv_sqrt = xp.where(keep, 1 / xp.sqrt(xp.where(keep, lam, xp.ones_like(lam))), xp.zeros_like(lam))
    return (V * inv_sqrt[..., None, :]) @ xp.matrix_transpose(V), lam


# (1 + x)^{-1/2} = Σ_j c_j x^j, c_j = binom(−½, j) = (−1)^j (2j)! / (4^j (j!)²); |c_j| ≤ 1
_INV_SQRT_SERIES = (1.0, -1 / 2, 3 / 8, -5 / 16, 35 / 128, -63 / 256, 231 / 1024, -429 / 2048, 6435 / 32768)


def _series_degree(lr: float, eps: float) -> int | None:
    # The degree k of the truncated series for (I + E)^{-1/2}, E = XᵀX − I of X = Y − lr·A with
    # ‖A‖₂ ≤ 1 and A tangent: E = lr²AᵀA plus the drift terms of YᵀY − I, so ‖E‖₂ ≤ r = lr² + √ε as long
    # as ‖YᵀY − I‖ stays below about √ε/3. The remainder is ≤ Σ_{j>k} r^j ≤ r^{k+1}/(1 − r); the
    # smallest k of 2, 4, 8 with r^{k+1}/(1 − r) ≤ ε/4, or None (use eigh). Three degrees only, because k
    # is a static argument of the compiled step: an lr schedule compiles it at most four times.
    r = lr * lr + eps**0.5
    for k in (2, 4, 8):
        if r < 1 and r ** (k + 1) / (1 - r) <= eps / 4:
            return k
    return None


def _degree_limits(eps: float) -> tuple[float, ...]:
    # The largest lr each degree of _series_degree covers (ascending: degree 2, 4, 8), by bisection on its
    # monotone rule: the thresholds for choosing the degree from a rate held in an array
    limits = []
    for k in (2, 4, 8):
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            d = _series_degree(mid, eps)
            lo, hi = (mid, hi) if d is not None and d <= k else (lo, mid)
        limits.append(lo)
    return tuple(limits)


# per machine epsilon (float16, bfloat16, float32, float64): made at import, so that a traced step reads a
# constant table (torch.compile warns on functools caches)
_DEGREE_LIMITS = {eps: _degree_limits(eps) for eps in (2.0**-10, 2.0**-7, 2.0**-23, 2.0**-52)}


def _limits(eps: float) -> tuple[float, ...]:
    limits = _DEGREE_LIMITS.get(eps)
    return _degree_limits(eps) if limits is None else limits


def _inv_sqrt_near_identity(E: Array, degree: int, xp: Any) -> Array:
    # (I + E)^{-1/2} ≈ I + E(c₁I + E(c₂I + … + c_k E)) by Horner: k − 1 products of n×n matrices
    # instead of an eigh (see _series_degree for the error bound). E is symmetric, and so is the result.
    n = E.shape[-1]
    eye = linalg.eye(n, E)
    c = _INV_SQRT_SERIES
    acc = c[degree] * E
    for j in range(degree - 1, 0, -1):
        acc = E @ (acc + c[j] * eye)
    return eye + acc


def _inv_sqrt_gram(S: Array, C: Array, xp: Any) -> tuple[Array, Array]:
    # For M = [S; R] with RᵀR = C: H = (MᵀM)^{-1/2} on the range (zero on the numerical null space),
    # so msign(M) = [S H; R H]; also the squared singular values of M (ascending) from the same eigh.
    return _inv_sqrt_psd(xp.matrix_transpose(S) @ S + C, xp)


def _dual_gradient_step(S: Array, P: Array, H: Array, sig2: Array, step: float, xp: Any) -> tuple[Array, Array]:
    # W₁ = S H (the top block of msign([S; R]) for S = K + P) and the gradient step on the compressed dual,
    # P − step·σ_min([S; R])·sym(W₁), with the ½ of sym folded into the scalar
    W1 = S @ H
    scale = (step / 2) * xp.sqrt(_backend.clip(sig2[..., :1], xp, min=0.0))
    return W1, P - (W1 + xp.matrix_transpose(W1)) * scale[..., None]


def _dual_descent(K: Array, C: Array, P: Array, *, xp: Any, n_iter: int, step: float) -> Array:
    # n_iter steps of P ← P − step·σ_min([K + P; R])·sym(W₁(P)) (the gradient step on the compressed dual)
    P = xp.broadcast_to(P, K.shape)

    def body(_, P):
        S = K + P
        H, sig2 = _inv_sqrt_gram(S, C, xp)
        return _dual_gradient_step(S, P, H, sig2, step, xp)[1]

    # a Python int trip count: no host read; on JAX one compiled loop body instead of n_iter copies
    return _backend.static_loop(body, P, n_iter, xp)


def _direction_blocks(K: Array, C: Array, P: Array, step: float, xp: Any) -> tuple[Array, Array, Array, Array]:
    # A = [Y Q]·[W₁; R H]·s = Y·(s W₁) + G⊥·(s H): the n×n factors (s W₁, s H) of the direction at P,
    # (sH)C(sH) (the polar step's B₂ᵀCB₂ up to lr²), and the next dual iterate, from the gradient step
    # that this evaluation of msign gives for free
    S = K + P
    H, sig2 = _inv_sqrt_gram(S, C, xp)
    W1, P_next = _dual_gradient_step(S, P, H, sig2, step, xp)
    # the top block is skew at the optimum; projecting it makes A exactly tangent for any n_iter
    W1 = (W1 - xp.matrix_transpose(W1)) / 2
    # ‖W‖₂ for W = [W₁; R H]: WᵀW = W₁ᵀW₁ + H C H. The projection may lift it above 1 by O(‖sym W₁‖)
    # before convergence; rescaling keeps A feasible, so ⟨G, A⟩ ≤ ‖[K + P; R]‖_* is a true duality
    # gap at every n_iter. (The largest absolute row sum of WᵀW, a cheaper upper bound, doubled the
    # gap at 10–30 iterations for 3 % of the step's time: the exact norm stays.)
    HCH = H @ C @ H
    norm2 = xp.sqrt(xp.max(xp.linalg.eigvalsh(xp.matrix_transpose(W1) @ W1 + HCH), axis=-1))
    scale = (1 / xp.maximum(norm2, xp.ones_like(norm2)))[..., None, None]
    return W1 * scale, H * scale, HCH * (scale * scale), P_next


def _stiefel_solve(Y: Array, G: Array, P: Array, *, xp: Any, n_iter: int, step: float) -> tuple[Array, Array]:
    K, Gp, C = _compress(Y, G, xp)
    P = _dual_descent(K, C, P, xp=xp, n_iter=n_iter, step=step)
    W1, H, _, P = _direction_blocks(K, C, P, step, xp)
    # [Y Q]·[W₁; R H] = Y W₁ + G⊥ H: Q is never needed
    return Y @ W1 + Gp @ H, P


def _stiefel_step(
    Y: Array,
    G: Array,
    P: Array,
    lr: Array,
    *,
    xp: Any,
    n_iter: int,
    step: float,
    direction: bool,
    degree: int | str | None,
) -> tuple[Array, ...]:
    # Same K, C and P as _stiefel_solve; then X = Y − lr·A = Y B₁ + G⊥ B₂ with the n×n blocks
    # B₁ = I − lr·W₁, B₂ = −lr·H, and polar(X) = X (XᵀX)^{-1/2} = Y (B₁ Z) + G⊥ (B₂ Z) with
    # Z = (XᵀX)^{-1/2}. The Gram matrix is assembled from n×n pieces,
    #     XᵀX = B₁ᵀ E B₁ + B₁ᵀ F B₂ + (B₁ᵀ F B₂)ᵀ + B₂ᵀ C B₂,   E = YᵀY,  F = YᵀG⊥ = YᵀG − E·YᵀG,
    # exactly (E and F are not assumed to be I and 0), so a drift of Y off the manifold is removed at
    # every step as by the N×n polar: four O(N·n²) products (YᵀG, YYᵀG, G⊥ᵀG⊥, YᵀY) and the final two,
    # against seven for direction + polar(Y − lr·A) on N×n.
    YtG, K, Gp, C = _grams(Y, G, xp)
    E = xp.matrix_transpose(Y) @ Y
    F = YtG - E @ YtG
    P = _dual_descent(K, C, P, xp=xp, n_iter=n_iter, step=step)
    W1, H, HCH, P = _direction_blocks(K, C, P, step, xp)
    n = Y.shape[-1]
    B1 = linalg.eye(n, Y) - lr * W1
    B2 = -lr * H
    B1t = xp.matrix_transpose(B1)
    cross = B1t @ (F @ B2)
    # B₂ᵀCB₂ = lr²·(sH)C(sH), already formed for ‖W‖₂
    gram = B1t @ (E @ B1) + cross + xp.matrix_transpose(cross) + (lr * lr) * HCH
    if degree == "select":  # the rate is an array: the degree its value needs, chosen where it lives
        eye = linalg.eye(n, Y)

        def series(k: int) -> Callable[[Array], Array]:
            return lambda g: _inv_sqrt_near_identity(g - eye, k, xp)

        branches = [series(2), series(4), series(8), lambda g: _inv_sqrt_psd(g, xp)[0]]
        Z = _backend.select(lr, _limits(float(xp.finfo(Y.dtype).eps)), branches, gram, xp)
    elif degree is None or isinstance(degree, str):
        Z, _ = _inv_sqrt_psd(gram, xp)
    else:
        Z = _inv_sqrt_near_identity(gram - linalg.eye(n, Y), degree, xp)
    Y_new = _backend.addmm(Y @ (B1 @ Z), Gp, B2 @ Z, xp)
    if direction:
        return Y_new, Y @ W1 + Gp @ H, P
    return Y_new, P


def stiefel_spectral_direction(
    Y: Array, G: Array, *, P0: Array | None = None, n_iter: int = 100, step: float = 1.0
) -> tuple[Array, Array]:
    """The spectral steepest direction A* on the Stiefel manifold, and the dual variable P.

    Solves max ⟨G, A⟩ s.t. ‖A‖₂ ≤ 1, YᵀA + AᵀY = 0 through the compressed dual
    min_{P = Pᵀ} ‖[K + P; R]‖_* (K = skew(YᵀG), G − YYᵀG = QR; see the module docstring) by
    gradient descent P ← P − step·σ_min([K + P; R])·sym(W₁), W = msign([K + P; R]), ``n_iter``
    times from P₀ = ``P0`` (zero by default). It returns A = [Y Q]·[skew(W₁); W₂]/max(1, ‖·‖₂)
    evaluated at the last iterate P_n, and P_{n+1}: the gradient step that the same evaluation of msign
    gives for free. Passed back as ``P0``, it continues the same sequence (``n_iter = k`` followed by
    ``n_iter = 0`` is ``n_iter = k + 1``), so every ``eigh`` advances the dual.
    For any ``n_iter`` A is feasible (tangent to rounding, ‖A‖₂ ≤ 1) and ⟨G, A⟩ ≤ ‖[K + P; R]‖_* for
    every symmetric P (:func:`stiefel_spectral_dual`); the difference, the duality gap, bounds the
    suboptimality and vanishes as P converges.

    Step size: the Hessian of the nuclear norm at a full-rank M is bounded by 1/σ_min(M), so
    ``step = 1`` (P ← P − σ_min·∇f, the 1/L step) is the default; the ½σ_min of the published
    prototype converges about twice as slowly. Accuracy (float64, from P = 0, Y and G Gaussian,
    relative duality gap (‖[K+P;R]‖_* − ⟨G, A⟩)/‖[K+P;R]‖_* with the P returned, median over 20 draws):

    =========  ========  =======  =======  =======  =======
    N×n        step      10 it.   30 it.   100 it.  200 it.
    =========  ========  =======  =======  =======  =======
    16×4       1         5e-5     2e-10    6e-16    4e-16
    32×5       1         2e-6     3e-13    7e-16    7e-16
    49×7       1         2e-6     2e-13    1e-15    8e-16
    64×16      1         6e-4     6e-7     2e-15    2e-15
    16×4       ½         2e-3     1e-5     1e-13    4e-16
    49×7       ½         4e-4     4e-7     1e-15    1e-15
    64×16      ½         6e-3     2e-4     3e-9     3e-15
    =========  ========  =======  =======  =======  =======

    Warm start: pass the P returned at the previous optimizer step as ``P0`` (momentum changes
    slowly, so far fewer iterations are needed). Cost: O(N·n²) for YᵀG, G⊥ and G⊥ᵀG⊥ (no QR), then
    ``n_iter + 1`` n×n ``eigh`` and one ``eigvalsh`` (for ‖W‖₂); batched over leading dimensions, a
    fixed number of iterations (``lax.fori_loop`` on JAX), no host synchronisation on array values.
    """
    xp = _check(Y, G, P0)
    if not isinstance(n_iter, int) or n_iter < 0:
        raise ValueError(f"n_iter must be a non-negative int, got {n_iter!r}")
    if not 0 < step < 2:
        raise ValueError(f"step must be in (0, 2), got {step!r}")
    n = Y.shape[-1]
    P = xp.zeros((n, n), dtype=Y.dtype, device=_backend.device(Y)) if P0 is None else P0
    return _backend.compiled(_stiefel_solve, xp, "xp", "n_iter", "step")(
        Y, G, P, xp=xp, n_iter=n_iter, step=float(step)
    )


def stiefel_spectral_step(
    Y: Array,
    G: Array,
    *,
    lr: Any,
    P0: Array | None = None,
    n_iter: int = 100,
    step: float = 1.0,
    return_direction: bool = False,
) -> tuple[Array, ...]:
    """Manifold Muon's step on the Stiefel manifold, Y_new = polar(Y − lr·A*), and the dual variable P.

    A* and P are exactly those of :func:`stiefel_spectral_direction` (same ``P0``, ``n_iter``,
    ``step``); the retraction is computed in the compressed coordinates: with
    A = Y·W₁ + G⊥·H (n×n blocks, G⊥ = G − YYᵀG),

        Y − lr·A = Y B₁ + G⊥ B₂,  B₁ = I − lr·W₁,  B₂ = −lr·H,
        polar(Y − lr·A) = Y (B₁ Z) + G⊥ (B₂ Z),   Z = (B₁ᵀEB₁ + B₁ᵀFB₂ + B₂ᵀFᵀB₁ + B₂ᵀCB₂)^{-1/2},

    E = YᵀY, F = YᵀG⊥, C = G⊥ᵀG⊥ — the polar factor X(XᵀX)^{-1/2} with XᵀX assembled from n×n
    pieces, the same formula as ``linalg.polar(Y − lr·A, method="eigh")`` (tested equal to 1e-12).
    Because ‖A‖₂ ≤ 1 and A is tangent, XᵀX = I + lr²AᵀA up to the drift of YᵀY from I, so Z is the
    binomial series I − E'/2 + 3E'²/8 − … of E' = XᵀX − I truncated where its remainder is below ε/4
    (degree 2, 4 or 8, chosen on the host from lr and the dtype: float32 at lr = 0.01 takes degree 2,
    one n×n product), and an ``eigh`` only for larger steps (float64 lr > 0.12). The bound assumes
    ‖YᵀY − I‖ ≲ √ε, which every step restores; a larger drift d is removed to O((2d)^{k+1}) in one step
    and to rounding in the next (float64, St(60, 8), lr = 1e-3, degree 2: d = 1e-3 gives
    max|YᵀY − I| = 5e-9, then 7e-16; d = 1e-2 gives 5e-6, then 9e-16; lr = 5e-3, degree 4, d = 1e-2:
    2e-9, then 7e-16). The eigh route removes any drift in one step.
    Cost: six O(N·n²) products (YᵀG, YYᵀG, G⊥ᵀG⊥, YᵀY and the two of Y_new) instead of seven, A
    itself (two more) only if ``return_direction``; ``n_iter + 1`` n×n ``eigh`` and one ``eigvalsh``.

    ``lr`` may also be a 0-d array (a schedule's value under ``jax.jit``, a tensor learning rate) or a
    traced scalar (a float that ``torch.compile`` made symbolic), whose value is not checked: the degree
    is then chosen where the rate lives (``geoarray._backend.select``: read where host reads are
    allowed, ``lax.switch`` on JAX, the ``eigh`` route under ``torch.compile`` or on a GPU), so a
    changing rate compiles nothing again.

    Returns (Y_new, P), or (Y_new, A*, P) with ``return_direction=True``.
    """
    xp = _check(Y, G, P0)
    if not isinstance(n_iter, int) or n_iter < 0:
        raise ValueError(f"n_iter must be a non-negative int, got {n_iter!r}")
    if not 0 < step < 2:
        raise ValueError(f"step must be in (0, 2), got {step!r}")
    n = Y.shape[-1]
    P = xp.zeros((n, n), dtype=Y.dtype, device=_backend.device(Y)) if P0 is None else P0
    degree: int | str | None
    if isinstance(lr, (bool, str, bytes)) or lr is None:
        raise ValueError(f"lr must be a non-negative number or a 0-d array, got {lr!r}")
    if is_number(lr):
        if not lr >= 0:
            raise ValueError(f"lr must be a non-negative number, got {lr!r}")
        # lr is an array argument, not a static one: a schedule would otherwise recompile every step on JAX
        # (full, not asarray: a Python number copied to a CUDA device is a synchronisation)
        lr_arr = xp.full((), float(lr), dtype=Y.dtype, device=_backend.device(Y))
        degree = _series_degree(float(lr), xp.finfo(Y.dtype).eps)
    else:
        lr_arr = rate_array(lr, Y, xp)
        degree = "select"
    return _backend.compiled(_stiefel_step, xp, "xp", "n_iter", "step", "direction", "degree")(
        Y, G, P, lr_arr, xp=xp, n_iter=n_iter, step=float(step), direction=bool(return_direction), degree=degree
    )


def stiefel_spectral_dual(Y: Array, G: Array, P: Array) -> Array:
    """The dual value ‖[K + P; R]‖_* (an upper bound on ⟨G, A⟩ for every feasible A) for symmetric P."""
    xp = _check(Y, G, P)
    K, _, C = _compress(Y, G, xp)
    S = K + linalg.sym(P)
    sig2 = xp.linalg.eigvalsh(xp.matrix_transpose(S) @ S + C)  # squared singular values of [K + P; R]
    return xp.sum(xp.sqrt(_backend.clip(sig2, xp, min=0.0)), axis=-1)


def grassmann_spectral_direction(Y: Array, G: Array) -> Array:
    """A* = msign((I − YYᵀ)G): the spectral steepest direction with YᵀA = 0 (Grassmann, horizontal).

    Closed form: every horizontal A satisfies ⟨G, A⟩ = ⟨(I − YYᵀ)G, A⟩ ≤ ‖(I − YYᵀ)G‖_*·‖A‖₂,
    attained by the matrix sign of the projected gradient, which is itself horizontal.
    Zero singular values of (I − YYᵀ)G give zero (the minimum-norm maximiser).
    """
    xp = _check(Y, G)
    Gh = G - Y @ (xp.matrix_transpose(Y) @ G)
    return linalg.msign(Gh)


def is_number(lr: Any) -> bool:
    """Whether ``lr`` is a Python number (known on the host), not an array or a traced scalar."""
    return isinstance(lr, (int, float)) and not isinstance(lr, bool)


def rate_array(lr: Any, like: Array, xp: Any) -> Array:
    """A rate as a 0-d array of ``like``'s dtype on its device: a number (or a scalar that ``torch.compile``
    traces as a symbol) filled in, an array reshaped and cast."""
    if isinstance(lr, (int, float)):
        # a product, not full(): torch.compile keeps a symbolic scalar an input of the graph in arithmetic, and
        # specializes it (recompiling at every new value) as full()'s fill value
        return lr * xp.ones((), dtype=like.dtype, device=_backend.device(like))
    return xp.astype(xp.reshape(lr, ()), like.dtype)

"""The retraction of g^hor through a small kernel (Brantner's paper, Appendix C, eqs. 19–21).

For W = [[A, −B̃], [B, 0]] ∈ g^hor (B̃ = Bᵀ on Stiefel and Grassmann, the symplectic inverse B⁺ on
the symplectic Stiefel manifold) write W = B′B″ᵀ with B′ = [[½A, I], [B, 0]], B″ᵀ = [[I, 0], [½A, −B̃]].
Then with the k×k Gram block G = B̃B and the 2k×2k matrix X = B″ᵀB′ = [[½A, I], [¼A² − G, ½A]],

    exp(W)E = E + B′ φ₁(X) [I; ½A],        Cay(W)E = E + B′ (I − ½X)⁻¹ [I; ½A],

with φ₁(X) = (e^X − I)X⁻¹ = Σ X^k/(k+1)!. Only 2k×2k matrices are exponentiated or solved, so a
step costs O(N·k²). Stiefel, Grassmann (A = 0) and symplectic Stiefel share these kernels.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from .. import _backend, linalg
from .._backend import device as _device

__all__ = ["bjorck_step", "kernel_norm_bound", "phi1", "retract_e", "retract_square", "retraction_kernel", "x_matrix"]

from .._typing import Array

# φ₁ Taylor polynomials in Paterson–Stockmeyer form, by the precision of the arithmetic:
# (degree, chunk, θ), cheapest first, with truncation error Σ_{k>degree} θ^k/(k+1)! below unit
# roundoff u on ‖X‖₁ ≤ θ (θ about 0.8 of the largest such norm):
#   float64 (u = 1.1e-16): degree 6 on θ = 0.02 (3 products), 10 on 0.17 (4), 19 on 1 (7, error ≈ 2e-20)
#   float32 (u = 6.0e-8):  degree 3 on θ = 0.04 (2 products), 5 on 0.2 (3), 8 on 0.7 (4, error ≈ 1.1e-8)
# Balanced optimizer steps have ‖X‖₁ ≈ ‖W‖ (Adam at lr 1e-3: 0.01–0.05), so the first or second
# rule serves them without doubling. The last rule is the one that scaling and doubling reduce to.
_PHI1_RULES = {
    "float64": ((6, 2, 0.02), (10, 3, 0.17), (19, 5, 1.0)),
    "float32": ((3, 2, 0.04), (5, 3, 0.2), (8, 3, 0.7)),
}


# Doublings run without host reads (eager torch and CuPy when the host reads policy forbids them:
# _backend.host_reads_allowed): the trip count is static, so every call pays for all of them. Four
# cover ‖X‖₁ ≤ 16·θ (float64 16, float32 11.2), far beyond an optimizer step (Adam at lr 1e-3:
# 0.01–0.05; a rotation by 2π is ‖X‖₁ ≈ 2π); a larger X comes out NaN, which an optimizer's
# non-finite policy then skips and counts. With host reads the budget is the manifold's max_doublings.
SYNC_FREE_DOUBLINGS = 4


def _phi1_rules(X: Array, xp: Any) -> tuple:
    return _PHI1_RULES["float64" if X.dtype == xp.float64 else "float32"]


def kernel_norm_bound(N: int, n: int, entry_bound: float) -> float:
    """θ ≥ ‖X_b‖₁ for the balanced kernel of :func:`retract_e` of every W ∈ g^hor of St(N, n) or Gr(N, n)
    whose entries (of A and B) are at most ``entry_bound`` = b in magnitude: ‖½A‖₁ ≤ nb/2 (a column of n
    entries), ‖c‖₁ = ‖(½A)² − BᵀB‖₁ ≤ (nb/2)² + n(N−n)b² (each entry of BᵀB a sum of N−n products, n per
    column), and ‖X_b‖₁ ≤ ‖½A‖₁ + ‖c‖₁^½, the bound the kernel is evaluated for; times 1 + 2⁻¹⁰ for the
    rounding of that bound's computation. Adam at lr η has b = η·C(β₁, β₂)
    (:func:`geoarray.optim.transforms.adam_ratio_bound`): θ = 0.049 on the paper's ViT weights
    (St(49, 7), η = 10⁻³, C = 2.345), 0.66 on St(1024, 64), 1.8 on St(4096, 128)."""
    half = n / 2
    return entry_bound * (half + math.sqrt(half * half + n * (N - n))) * (1 + 2.0**-10)


def _static_route(X: Array, xp: Any, theta: float) -> tuple[tuple, int] | None:
    """The cheapest fixed evaluation of φ₁ that covers ‖X‖₁ ≤ ``theta``: (the lowest rule whose θ does, 0),
    else (the top rule, s) on X/2ˢ with s doublings; None beyond :data:`SYNC_FREE_DOUBLINGS` doublings.

    Comparisons only (no ``math.isfinite``, no logarithm): under ``torch.compile`` ``theta`` can arrive
    as a symbolic float, whose comparisons dynamo evaluates (and guards) but whose ``math.isfinite`` it
    cannot trace."""
    if not theta >= 0:  # also NaN
        return None
    rules = _phi1_rules(X, xp)
    for rule in rules:
        if theta <= rule[2]:
            return rule, 0
    for doublings in range(1, SYNC_FREE_DOUBLINGS + 1):  # the fewest with θ/2ˢ ≤ the top rule's θ (not ∞)
        if theta <= rules[-1][2] * 2.0**doublings:
            return rules[-1], doublings
    return None


def _phi1_fixed(X: Array, xp: Any, rule: tuple, doublings: int) -> Array:
    """φ₁(X) by ``rule``'s Taylor polynomial of X/2ˢ and s = ``doublings`` unmasked doublings (s static):
    to unit roundoff wherever ‖X‖₁ ≤ θ·2ˢ. The fewest operations a fixed route can take."""
    Xs = X * (0.5**doublings) if doublings else X
    U = _phi1_taylor(Xs, xp, rule)
    for k in range(doublings):  # φ₁(2Z) = φ₁(Z) + ½ φ₁(Z) Z φ₁(Z) with Z = 2ᵏ X_s (exact scalings)
        U = _backend.addmm(U, U @ (Xs * 2.0**k if k else Xs), U, xp, alpha=0.5)
    return U


# exp's Taylor polynomial Σ_{k≤m} X^k/k! for the square retraction (N = n, where g(W)E = exp(A)): the
# (degree, chunk) of φ₁'s rules with θ = 0.8·(u·(m+1)!)^{1/(m+1)}, so that the leading truncation term
# θ^{m+1}/(m+1)! is below unit roundoff u. The same products as φ₁'s rule, without I + A·φ₁(A)'s last one.
_EXP_RULES = {
    name: tuple((m, c, 0.8 * (u * math.factorial(m + 1)) ** (1.0 / (m + 1))) for m, c, _ in rules)
    for name, u, rules in (("float64", 2.0**-53, _PHI1_RULES["float64"]), ("float32", 2.0**-24, _PHI1_RULES["float32"]))
}


# the matrix size from which _phi1_taylor forms its chunks by scalings and additions instead of one
# contraction over the stacked powers (128×128 float32, one thread: 178 against 300 µs for exp's
# degree-5 rule; the contraction wins on the small batched kernels of the paper's ViT, eagerly). Under
# torch.compile always the scalings: inductor fuses them into one loop, while the contraction became a
# (3×2)·(2×65 856) GEMM (the ViT set's 336 kernels of 14×14) that MKL ran in 0.47 ms on the CPU, a ninth
# of the compiled step; under jax.jit the two measured alike (3.50 against 3.51 ms per ViT step)
_CONTRACT_BELOW = 32


def _coefficient_matrix(degree: int, chunk: int, shift: int = 1) -> tuple[tuple[float, ...], ...]:
    """The Taylor coefficients 1/(k+shift)! (φ₁: shift 1, exp: 0) in chunks of ``chunk`` (zero-padded)."""
    n_chunks = -(-(degree + 1) // chunk)
    coeffs = [1.0 / math.factorial(k + shift) if k <= degree else 0.0 for k in range(n_chunks * chunk)]
    return tuple(tuple(coeffs[j * chunk : (j + 1) * chunk]) for j in range(n_chunks))


# Every rule's matrices, built once here rather than by functools.cache: dynamo warns of "potential
# silent incorrectness" at each lru_cache wrapper it traces, and φ₁ is traced in every compiled step
_COEFFICIENT_MATRICES = {
    (degree, chunk, shift): _coefficient_matrix(degree, chunk, shift)
    for rules in _PHI1_RULES.values()
    for degree, chunk, _ in rules
    for shift in (0, 1)
}


def _norm1(X: Array, xp: Any) -> Array:
    return _backend.norm1(X, xp)


def _phi1_taylor(X: Array, xp: Any, rule: tuple, shift: int = 1) -> Array:
    """Σ_{k≤m} X^k/(k+1)! for ``rule`` = (m, c, θ) by Paterson–Stockmeyer: chunks qⱼ = Σᵢ c_{cj+i} Xⁱ of
    degree < c, and p = q₀ + Xᶜ(q₁ + Xᶜ(q₂ + …)) (m = 19 in float64: chunks of 5, 4 + 3 products).

    For matrices smaller than ``_CONTRACT_BELOW`` the chunks' powers X…X^{c−1} are one contraction with
    the coefficient matrix (one operation instead of dozens of small scalings and additions); their
    identity terms c_{cj}·I are added as an unbatched m×m matrix, which broadcasts (a batched identity
    cost NumPy a broadcast and a copy). Not under ``torch.compile`` (see ``_CONTRACT_BELOW``).
    """
    degree, chunk, _ = rule
    matrix = _COEFFICIENT_MATRICES.get((degree, chunk, shift))  # shift 0: exp's polynomial Σ X^k/k! instead
    if matrix is None:
        matrix = _coefficient_matrix(degree, chunk, shift)
    eye = linalg.eye(X.shape[-1], X)
    powers = [X]
    for _ in range(2, chunk + 1):
        powers.append(powers[-1] @ X)
    top = powers.pop()  # X^chunk
    if len(powers) == 1:
        parts = [_times(row[1], X) for row in matrix]
    elif X.shape[-1] >= _CONTRACT_BELOW or _backend.is_compiling():
        # large matrices: the scalings and additions are cheap next to a contraction over a stacked copy
        parts = []
        for row in matrix:
            part = _times(row[1], X)
            for c, P in zip(row[2:], powers[1:], strict=True):
                part = part + c * P
            parts.append(part)
    else:
        coeffs = _backend.host_constant(tuple(row[1:] for row in matrix), X, xp)  # made once per device
        stacked = xp.tensordot(coeffs, xp.stack(powers, axis=0), axes=1)  # (n_chunks, ..., m, m)
        parts = [stacked[j, ...] for j in range(len(matrix))]
    U = _backend.plus_identity(parts[-1], matrix[-1][0], eye, xp)
    for j in range(len(matrix) - 2, -1, -1):
        U = _backend.addmm(_backend.plus_identity(parts[j], matrix[j][0], eye, xp), top, U, xp)
    return U


def _times(c: float, X: Array) -> Array:
    # exp's coefficient 1/1! leaves X as it is (1·X is X exactly): one operation fewer per step
    return X if c == 1.0 else c * X


def _phi1_scaled(X: Array, bound: Array, xp: Any, max_doublings: int) -> Array:
    """φ₁(X) by scaling and doubling, given ``bound`` ≥ ‖X‖₁ per batch element: X_s = X/2ˢ with
    ‖X_s‖₁ ≤ θ, the Taylor polynomial of :func:`_phi1_taylor`, then φ₁(2Z) = φ₁(Z) + ½ φ₁(Z) Z φ₁(Z) s times.
    Elements needing more than ``max_doublings`` come out NaN."""
    rule = _phi1_rules(X, xp)[-1]
    theta = rule[2]
    ratio = bound / theta
    s = xp.ceil(xp.log2(xp.maximum(ratio, xp.ones_like(ratio))))
    s = xp.where(xp.isfinite(s), s, xp.zeros_like(s))  # NaN/Inf input: no doublings, NaN out
    Xs = X / xp.pow(2.0, s)[..., None, None]
    U = _phi1_taylor(Xs, xp, rule)

    def double(k, U):
        # the k-th doubling uses 2ᵏ·X_s (exact: a power of two) where it is active (k < s), and a zero
        # matrix elsewhere, which leaves U exactly as it is: no mask over U, no carried 2ᵏ·X_s
        two_k = 2.0**k if isinstance(k, int) else xp.pow(2.0, xp.astype(k, X.dtype))  # k traced in loops
        scale = xp.astype(s > k, X.dtype) * two_k
        return _backend.addmm(U, U @ (Xs * scale[..., None, None]), U, xp, alpha=0.5)

    U = _backend.fori_loop(double, U, s, max_doublings, xp)
    nan = xp.full((), float("nan"), dtype=X.dtype, device=_device(X))  # full: no copy from the host
    return xp.where((s > max_doublings)[..., None, None], nan, U)


def _phi1_bounded(X: Array, bound: Array, xp: Any, max_doublings: int, static_bound: float | None = None) -> Array:
    """φ₁(X) given ``bound`` ≥ ‖X‖₁ per batch element, by the cheapest exact route for the largest bound:
    the lowest-degree Taylor rule whose θ covers it (no scaling, doubling or masking: an optimizer step
    takes 2 products in float32 instead of 4 plus ~20 small operations), or beyond the last θ (and for
    non-finite input) the top rule with per-element scaling and doubling (:func:`_phi1_scaled`).

    The choice is :func:`geoarray._backend.select`: eager with host reads allowed, the largest bound is
    read to the host once (the one host read of a retraction, which the doubling loop needs anyway); on
    JAX a ``lax.switch`` runs the chosen branch only; under ``torch.compile`` (which has no multi-way
    conditional) the scaled route, with its doublings in a ``while_loop``. Eager torch and CuPy without
    host reads do fixed work: the top rule and a static budget of :data:`SYNC_FREE_DOUBLINGS` masked
    doublings (elements needing more come out NaN). Both fixed-work cases, eager without host reads and
    ``torch.compile``, take a cheaper route where ``static_bound``, a Python float known on the host to
    be ≥ every element's ``bound`` (an optimizer whose steps are bounded whatever its gradients:
    :func:`kernel_norm_bound`), names one: the lowest rule covering it, with the fewest unmasked
    doublings (:func:`_phi1_fixed`; for Adam on the paper's ViT weights in float32 the degree-5 rule, 3
    products, instead of the degree-8 rule and four masked doublings, 12 products and ~30 small
    operations; compiled, instead of the degree-8 rule and a ``while_loop``; compiled on the CPU, only a
    route without doublings: there the loop's trip count costs no synchronisation, and it doubles only as
    often as each step's norm needs). An element beyond the
    route's reach (which the bound excludes) comes out NaN, as beyond the doubling budget. The other
    routes ignore it. All routes are accurate to unit roundoff, so the results agree to rounding.
    """
    route = None
    if not _backend.selects_on_device(xp):
        fixed_work = not _backend.is_traced(bound) and not _backend.host_reads_allowed(bound)
        compiling = _backend.is_compiling()
        if static_bound is not None and (fixed_work or compiling):
            route = _static_route(X, xp, static_bound)
        if compiling and route is not None and route[1] > 0 and getattr(_device(bound), "type", None) == "cpu":
            # compiled on the CPU, the doubling loop reads its trip count for free and doubles only as
            # often as the norm needs, where a fixed route always takes all of the bound's doublings
            # (St(4096, 128), Adam at lr 1e-3: 2; the compiled step 1.12–1.13× its kernels, not 1.06–1.07×)
            route = None
        if route is None and fixed_work:
            return _phi1_scaled(X, bound, xp, min(max_doublings, SYNC_FREE_DOUBLINGS))
    if route is not None:
        rule, doublings = route
        nan = xp.full((), float("nan"), dtype=X.dtype, device=_device(X))
        return xp.where((bound > rule[2] * 2.0**doublings)[..., None, None], nan, _phi1_fixed(X, xp, rule, doublings))
    rules = _phi1_rules(X, xp)
    largest = _largest(bound, xp)
    branches: list[Callable[[Any], Any]] = [functools.partial(_phi1_taylor, xp=xp, rule=rule) for rule in rules]
    # the top rule's Taylor polynomial alone is the scaled route with no doubling; traced, it is left
    # to the scaled route (one branch fewer to compile)
    if _backend.is_traced(bound):
        branches = branches[:-1]
    branches.append(lambda Z: _phi1_scaled(Z, bound, xp, max_doublings))
    return _backend.select(largest, tuple(rule[2] for rule in rules[: len(branches) - 1]), branches, X, xp)


def phi1(X: Array, xp: Any, max_doublings: int) -> Array:
    """φ₁(X) = Σ_k X^k/(k+1)! = (e^X − I)X⁻¹ by balancing, scaling and doubling.

    Balancing: for X = [[X₁₁, X₁₂], [X₂₁, X₂₂]] (equal halves) φ₁(X) = D φ₁(D⁻¹XD) D⁻¹ with
    D = diag(I, αI), α = (‖X₂₁‖/‖X₁₂‖)^½. The kernels of the retractions have X₁₂ = I and
    X₂₁ = O(‖W‖²), so balancing makes ‖D⁻¹XD‖ = O(‖W‖) and optimizer-sized steps need no doubling.
    Scaling and doubling: with X_s = X/2ˢ, ‖X_s‖₁ ≤ θ, the Taylor polynomial (degree 19 in float64,
    8 in float32) gives φ₁(X_s) to unit roundoff, and φ₁(2Z) = φ₁(Z) + ½ φ₁(Z) Z φ₁(Z) undoes the scaling s times.
    """
    m = X.shape[-1]
    balance = m % 2 == 0 and m > 0
    if balance:
        h = m // 2
        n12, n21 = _norm1(X[..., :h, h:], xp), _norm1(X[..., h:, :h], xp)
        ok = xp.logical_and(n12 > 0, n21 > 0)
        alpha = xp.where(ok, xp.sqrt(n21 / xp.where(ok, n12, xp.ones_like(n12))), xp.ones_like(n12))[..., None, None]
        X = xp.concat(
            [xp.concat([X[..., :h, :h], alpha * X[..., :h, h:]], axis=-1),
             xp.concat([X[..., h:, :h] / alpha, X[..., h:, h:]], axis=-1)],
            axis=-2,
        )  # fmt: skip
    U = _phi1_bounded(X, _norm1(X, xp), xp, max_doublings)
    if balance:
        U = xp.concat(
            [xp.concat([U[..., :h, :h], U[..., :h, h:] / alpha], axis=-1),
             xp.concat([alpha * U[..., h:, :h], U[..., h:, h:]], axis=-1)],
            axis=-2,
        )  # fmt: skip
    return U


def x_matrix(halfA: Array, gram: Array, xp: Any) -> Array:
    """X = B″ᵀB′ = [[½A, I], [¼A² − G, ½A]] for the Gram block G = B̃B (module docstring)."""
    k = halfA.shape[-1]
    eye = xp.broadcast_to(linalg.eye(k, halfA), halfA.shape)
    top = xp.concat([halfA, eye], axis=-1)
    bottom = xp.concat([halfA @ halfA - gram, halfA], axis=-1)
    return xp.concat([top, bottom], axis=-2)


def retraction_kernel(halfA: Array, gram: Array, xp: Any, method: str, max_doublings: int) -> Array:
    """K with g(W) = I + B′ K B″ᵀ: φ₁(X) (``"geodesic"``) or (I − ½X)⁻¹ (``"cayley"``)."""
    X = x_matrix(halfA, gram, xp)
    if method == "geodesic":
        return phi1(X, xp, max_doublings)
    eye = linalg.eye(X.shape[-1], X)
    return _backend.solve(eye - X / 2, xp.broadcast_to(eye, X.shape), xp)


def retract_e(
    halfA: Array,
    gram: Array | None,
    B: Array,
    *,
    xp: Any,
    method: str,
    max_doublings: int,
    static_bound: float | None = None,
    low: Array | None = None,
) -> tuple[Array, Array]:
    """The two row blocks of g(W)E: E-rows I + ½A·D₁ + D₂ (k×k) and the other rows B·D₁, where
    D = φ₁(X)[I; ½A] (geodesic) or (I − ½X)⁻¹[I; ½A] (Cayley).

    Geodesic: X = [[a, I], [c, a]] with a = ½A, c = a² − G is built already balanced,
    X_b = [[a, αI], [c/α, a]] = D⁻¹XD with D = diag(I, αI), α = ‖c‖₁^½ (as :func:`phi1` would
    balance it), so that D = D·φ₁(X_b)·[I; a/α] and ‖X_b‖₁ ≤ ‖a‖₁ + ‖c‖₁^½ = O(‖W‖): an optimizer
    step needs no doubling. The bound, not the norm of X_b, sets the scaling (one reduction fewer).
    ``static_bound``: a host float ≥ that bound for every element (:func:`kernel_norm_bound`), which lets a
    step without host reads take the cheapest fixed route (:func:`_phi1_bounded`). ``low``: c = a² − G
    when the caller has it cheaper (geodesic only; ``gram`` may then be None).
    """
    k = halfA.shape[-1]
    if method != "geodesic":
        if gram is None:
            raise ValueError(f"retract_e: the {method!r} kernel needs gram = B̃B, got None")
        eye = xp.broadcast_to(linalg.eye(k, halfA), halfA.shape)
        c = xp.concat([eye, halfA], axis=-2)  # B″ᵀE, (..., 2k, k)
        D = _backend.solve(linalg.eye(2 * k, halfA) - x_matrix(halfA, gram, xp) / 2, c, xp)
        D_top, D_bot = D[..., :k, :], D[..., k:, :]
        return eye + halfA @ D_top + D_bot, _backend.matmul(B, D_top, xp)
    if low is None:
        if gram is None:
            raise ValueError("retract_e: give gram = B̃B or low = a² − B̃B, got neither")
        low = halfA @ halfA - gram  # c = a² − G
    # α = ‖c‖₁^½, kept positive for a zero step (c = 0) by the smallest normal number: X_b is then
    # [[a, ~0], [0, a]] and α cancels from D below
    alpha0 = xp.sqrt(_norm1(low, xp) + xp.finfo(low.dtype).smallest_normal)
    alpha = alpha0[..., None, None]
    eye = linalg.eye(k, halfA)  # unbatched: it broadcasts
    Xb = xp.concat([xp.concat([halfA, alpha * eye], axis=-1), xp.concat([low / alpha, halfA], axis=-1)], axis=-2)
    U = _phi1_bounded(Xb, _norm1(halfA, xp) + alpha0, xp, max_doublings, static_bound)
    # D = U·[I; a/α] = U[:, :k] + U[:, k:]·a/α: one product, and no [I; a/α] to assemble
    D = _backend.addmm(U[..., :, :k], U[..., :, k:], halfA / alpha, xp)
    D_top = D[..., :k, :]
    return _backend.addmm(eye + alpha * D[..., k:, :], halfA, D_top, xp), _backend.matmul(B, D_top, xp)


def retract_square(halfA: Array, *, xp: Any, method: str, max_doublings: int) -> Array:
    """g(W)E when the horizontal part is empty (N = n, the orthogonal group: W = A): exp(A) = I + A·φ₁(A)
    (geodesic) or Cay(A) = (I − ½A)⁻¹(I + ½A). These are the matrices :func:`retract_e`
    gives with G = 0, from an n×n instead of a 2n×2n kernel; A is skew, so no balancing is needed."""
    if method != "geodesic":
        eye = linalg.eye(halfA.shape[-1], halfA)
        return _backend.solve(eye - halfA, eye + halfA, xp)
    return _exp_skew(halfA + halfA, xp=xp, max_doublings=max_doublings)


def _exp_skew(A: Array, *, xp: Any, max_doublings: int) -> Array:
    """exp(A) for the A-block of a square frame's step (:func:`retract_square`'s geodesic case, taking A
    itself, as :meth:`~geoarray.manifolds.Stiefel.apply_retraction` has it: no ½A to halve and double
    back, two operations per step): exp's Taylor polynomial where ‖A‖₁ is within a rule's θ
    (``_EXP_RULES``), else I + A·φ₁(A) by scaling and doubling."""
    bound = _norm1(A, xp)

    def general(Z: Array) -> Array:
        return Z @ _phi1_bounded(Z, bound, xp, max_doublings) + linalg.eye(Z.shape[-1], Z)

    # the cheapest exp Taylor rule covering the largest bound (one product fewer than I + A·φ₁(A)); beyond
    # the last rule's θ, and wherever select cannot choose (fixed work without host reads, torch.compile),
    # I + A·φ₁(A) by scaling and doubling
    rules = _EXP_RULES["float64" if A.dtype == xp.float64 else "float32"]
    branches: list[Callable[[Any], Any]] = [
        functools.partial(_phi1_taylor, xp=xp, rule=rule, shift=0) for rule in rules
    ]
    return _backend.select(_largest(bound, xp), tuple(rule[2] for rule in rules), [*branches, general], A, xp)


def _largest(bound: Array, xp: Any) -> Array:
    """The largest of a batch of bounds as a 0-d array: an unbatched bound is that already (no reduction
    to dispatch), an empty batch's is 0."""
    if bound.ndim == 0:
        return bound
    return xp.max(bound) if math.prod(bound.shape) else xp.zeros((), dtype=bound.dtype, device=_device(bound))


def bjorck_step(Y: Array, xp: Any, out: Array | None = None) -> Array:
    """Y − ½·Y(YᵀY − I): one step of Björck and Bowie's iteration towards the orthonormal polar factor
    of Y (*An iterative algorithm for computing the best estimate of an orthogonal matrix*, SIAM J.
    Numer. Anal. 8, 1971). For YᵀY = I + E it gives I − ¾E² + ¼E³: an orthogonality error ε becomes
    O(ε²) plus the rounding of this step, which is small because the correction ½·Y·E is small.

    Used on float32 retracted points (:meth:`~geoarray.manifolds.Stiefel.apply_retraction`): applying
    the section Q = I − VTVᵀ to g(W)E in float32 cancels O(1) terms into entries of size N^-½, which
    leaves max|YᵀY − I| ≈ 2e-6 on 336 × Stiefel(49, 7) at every step (it does not accumulate: the
    section is rebuilt from each point); after this step it is ≈ 4e-7 (``benchmarks/soak.py``).

    ``out``: an array of Y's shape and dtype to write the result into, overlapping none of Y.
    """
    eye = linalg.eye(Y.shape[-1], Y)
    E = xp.matrix_transpose(Y) @ Y - eye
    if out is not None:
        # Y·(I − ½E), one product straight into out (no copy of Y into it first, as Y − ½·Y·E would take):
        # the same step, rounded once in I − ½E's diagonal (float32: a relative 6e-8 per column)
        return _backend.matmul_into(out, Y, eye - E / 2, xp)
    return _backend.addmm(Y, Y, E, xp, alpha=-0.5)

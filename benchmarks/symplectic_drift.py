"""SymplecticStiefel: constraint drift over optimizer steps, and the cost of one step in N.

Runs plain Riemannian gradient descent on the symplectic eigenvalue problem min tr(YᵀSY), S ≻ 0
(Williamson's bound 2(d₁ + … + d_n) is the optimum), with steps of fixed size ‖ηW‖, and prints the
largest constraint violation max |Yᵀ𝕁Y − 𝕁| met along the way, with and without the Newton
re-symplectification of the section, next to ‖Y‖₂ (the drift scales with ‖Y‖₂²). Then it times one
step (rgrad → section → global_rep → retraction → apply_section) for growing N at fixed n and fits
the exponent p of time ∝ N^p (≈ 1 for the O(N·n²) section; a dense 2N×2N section would show 2–3).

    python benchmarks/symplectic_drift.py [--backend numpy|torch|jax|array-api-strict] [--steps 1000]
"""

from __future__ import annotations

import argparse

import numpy as np
from _timing import best_time, load_namespace

import geoarray
from geoarray.manifolds.symplectic_stiefel import SymplecticStiefel


def _J(k: int) -> np.ndarray:
    return np.block([[np.zeros((k, k)), np.eye(k)], [-np.eye(k), np.zeros((k, k))]])


def _to_host(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except Exception:
        return np.from_dlpack(x)


def drift_run(xp, N2: int, n2: int, steps: int, step: float, resymplectify: bool, method: str):
    M = SymplecticStiefel(N2, n2, resymplectify=resymplectify, retraction_method=method)
    rng = np.random.default_rng(0)
    A = rng.normal(size=(N2, N2))
    S_host = A @ A.T / N2 + 0.1 * np.eye(N2)
    S = xp.asarray(S_host)
    d = np.sort(np.abs(np.linalg.eigvals(_J(N2 // 2) @ S_host).imag))[::2]
    Y = M.random(0, xp=xp)
    drift = 0.0
    Jn, Jm = _J(N2 // 2), _J(n2 // 2)
    for _ in range(steps):
        lam = M.global_section(Y)
        W = M.global_rep(lam, M.rgrad(Y, 2 * (S @ Y)))
        Y = M.apply_section(lam, M.retraction(W * (-step / float(W.norm()))))
        Yh = _to_host(Y)
        drift = max(drift, float(np.max(np.abs(Yh.T @ Jn @ Yh - Jm))))
    f = float(np.sum(Yh * (S_host @ Yh)))
    return drift, f, 2 * float(np.sum(d[: n2 // 2])), float(np.linalg.norm(Yh, 2))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step", type=float, default=0.05, help="‖ηW‖ per step")
    parser.add_argument("--method", default="cayley", choices=["cayley", "geodesic"])
    parser.add_argument("--n2", type=int, default=8, help="columns for the timing sweep")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    args = parser.parse_args(argv)
    xp = load_namespace(args.backend)

    print(f"drift over {args.steps} steps of size {args.step} on {args.backend}, float64, {args.method}")
    print(f"{'N2':>5} {'n2':>4} {'resympl.':>9} {'max drift':>10} {'‖Y‖₂':>7} {'f':>9} {'bound':>9}")
    for N2, n2 in [(12, 4), (40, 10), (20, 20)]:
        for resym in (True, False):
            drift, f, bound, normY = drift_run(xp, N2, n2, args.steps, args.step, resym, args.method)
            print(f"{N2:>5} {n2:>4} {resym!s:>9} {drift:>10.2e} {normY:>7.2f} {f:>9.4f} {bound:>9.4f}")

    print(f"\none step of SymplecticStiefel(N2, {args.n2}) on {args.backend}")
    print(f"{'N2':>6} {'step [ms]':>10}")
    rows = []
    for N2 in args.sizes:
        M = SymplecticStiefel(N2, args.n2)
        Y = M.random(0, xp=xp)
        G = geoarray.random.normal(1, (N2, args.n2), xp=xp)

        def one_step(M=M, Y=Y, G=G):
            lam = M.global_section(Y)
            W = M.global_rep(lam, M.rgrad(Y, G))
            return M.apply_section(lam, M.retraction(-1e-3 * W))

        t = best_time(one_step)
        rows.append((N2, t))
        print(f"{N2:>6} {t * 1e3:>10.3f}")
    Ns, ts = np.array([r[0] for r in rows], float), np.array([r[1] for r in rows])
    p = np.polyfit(np.log(Ns[-3:]), np.log(ts[-3:]), 1)[0]
    print(f"fitted exponent in N over the three largest sizes: {p:.2f} (O(N·n²) → 1)")


if __name__ == "__main__":
    main()

"""How one Stiefel optimizer step scales with N (the paper's O(N·n²) claim, appendix C).

One step is what Algorithm 1 does per weight besides the cache arithmetic:
rgrad → global_section (Householder, compact WY) → global_rep → retraction (2n×2n kernel) → apply_section.
For N = 256 … 8192 at n = 64 this prints the time per step, the ratio to one N×n by n×n matmul in the
same run, and the least-squares exponent p of time ∝ N^p over the sizes (≈ 1 for O(N·n²); a method that
formed N×N matrices would show 2–3).

    python benchmarks/manifold_scaling.py [--backend numpy|torch|jax|array-api-strict] [--n 64]
"""

from __future__ import annotations

import argparse

import numpy as np
from _timing import best_time, load_namespace

import geoarray


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--method", default="geodesic", choices=["geodesic", "cayley"])
    args = parser.parse_args(argv)
    xp = load_namespace(args.backend)
    n = args.n

    print(f"Stiefel(N, {n}) step on {args.backend}, float64, {args.method} retraction, householder section")
    print(f"{'N':>6} {'step [ms]':>10} {'matmul [ms]':>12} {'step/matmul':>12}")
    rows = []
    for N in args.sizes:
        M = geoarray.Stiefel(N, n, retraction_method=args.method)
        Y = M.random(0, xp=xp)
        G = geoarray.random.normal(1, (N, n), xp=xp)
        S = geoarray.random.normal(2, (n, n), xp=xp)

        def step(M=M, Y=Y, G=G):
            lam = M.global_section(Y)
            W = M.global_rep(lam, M.rgrad(Y, G))
            return M.apply_section(lam, M.retraction(-1e-3 * W))

        t_step = best_time(step)
        t_mm = best_time(lambda Y=Y, S=S: Y @ S)
        rows.append((N, t_step))
        print(f"{N:>6} {t_step * 1e3:>10.3f} {t_mm * 1e3:>12.4f} {t_step / t_mm:>12.1f}")
    Ns, ts = np.array([r[0] for r in rows], float), np.array([r[1] for r in rows])
    p = np.polyfit(np.log(Ns), np.log(ts), 1)[0]
    p_large = np.polyfit(np.log(Ns[-3:]), np.log(ts[-3:]), 1)[0]
    print(f"fitted exponent in N: {p:.2f} over all sizes, {p_large:.2f} over the three largest (O(N·n²) → 1)")


if __name__ == "__main__":
    main()

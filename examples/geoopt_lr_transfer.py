"""How geoopt's learning rates carry over to geoarray.torch.Adam on Stiefel (the migration guide's table).

geoopt's tests/test_adam.py::test_adam_stiefel, over seeds: X on Stiefel(20, 10) starts at the polar
factor of a Gaussian matrix and minimises ‖X − Q‖² to a random point Q; the number of steps until
‖X − Q‖ < 1e-4 (capped at ``--max-steps``) for geoopt's RiemannianAdam at rate η and geoarray.torch.Adam
at η and at η/√d, d = dim Stiefel(20, 10) = 145. geoopt keeps one second moment per matrix
(``component_inner`` of the Stiefel manifold is ⟨G, G⟩ broadcast), so its step has Frobenius length
≈ η; geoarray keeps one per coordinate of g^hor, as torch.optim.Adam does per entry, so every
coordinate moves by ≈ η and the step is ≈ η·√d long.

    PYTHONPATH=src python examples/geoopt_lr_transfer.py --seeds 8
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

import geoarray as ga
import geoarray.torch as gt

N, n = 20, 10
DIM = N * n - n * (n + 1) // 2  # dim St(N, n)


def steps_to_converge(library: str, lr: float, seed: int, max_steps: int) -> int:
    """Steps of Adam until ‖X − Q‖ < 1e-4, or ``max_steps`` + 1 when it does not get there."""
    torch.manual_seed(seed)
    data = torch.randn(N, n, dtype=torch.float64)
    Q = torch.linalg.qr(torch.randn(N, n, dtype=torch.float64))[0]
    if library == "geoopt":
        import geoopt

        X = geoopt.ManifoldParameter(data, manifold=geoopt.Stiefel())
        with torch.no_grad():
            X.proj_()
        opt = geoopt.optim.RiemannianAdam([X], lr=lr, stabilize=4500)
    else:
        X = gt.ManifoldParameter(data, ga.Stiefel(N, n))
        opt = gt.Adam([X], lr=lr)
    for k in range(max_steps):
        if (X - Q).norm() < 1e-4:
            return k
        opt.zero_grad()
        (X - Q).pow(2).sum().backward()
        opt.step()
    return max_steps + int((X - Q).norm() >= 1e-4)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-2, 1e-1, 1.0])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print(f"steps to ‖X − Q‖ < 1e-4 on Stiefel({N}, {n}), {args.seeds} seeds, mean ± std; 'failed' = not within "
          f"{args.max_steps}")  # fmt: skip
    for lr in args.lrs:
        for library, rate in (("geoopt", lr), ("geoarray", lr), ("geoarray", lr / math.sqrt(DIM))):
            counts = [steps_to_converge(library, rate, s, args.max_steps) for s in range(args.seeds)]
            done = [c for c in counts if c <= args.max_steps]
            failed = len(counts) - len(done)
            mean = statistics.mean(done) if done else float("nan")
            std = statistics.stdev(done) if len(done) > 1 else 0.0
            rows.append({"library": library, "lr": rate, "mean": mean, "std": std, "failed": failed})
            print(f"{library:9s} lr = {rate:9.3g}: {mean:8.1f} ± {std:6.1f} steps, failed {failed}/{len(counts)}")
    return rows


if __name__ == "__main__":
    main()

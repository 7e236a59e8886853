"""Step cost of manifold Muon against torch.optim.Muon and torch.optim.Adam on the same weights.

    PYTHONPATH=src python benchmarks/muon_step.py [--steps 30] [--threads 2] [--n-iter 10]

torch, float32, CPU. Each optimizer owns its own copy of the same weights and receives the same
fixed random gradient each step; the time of one full step (momentum, direction, retraction or
update) is measured ``--steps`` times after 3 warm-up steps, the three optimizers interleaved
step by step (so that load from other processes affects them alike), and the median is reported.

* manifold Muon: ``geoarray.optim.ManifoldMuon(lr=0.01).update`` on one Stiefel(N, n) leaf (EMA
  momentum 0.95 with torch's Nesterov form, dual warm-started from the previous step, ``--n-iter``
  dual iterations (default: the optimizer's, 1), polar retraction in the compressed n×n
  coordinates); the ViT set is one batched (336, 49, 7) leaf;
* torch.optim.Muon: one parameter per matrix (it accepts 2-D parameters only), bfloat16 Newton–Schulz;
* torch.optim.Adam: the same parameters, default settings (foreach implementation).

Measured (torch 2.13 CPU, ``--threads 1 --steps 40``, 2026-11-23, three runs alternating with the
previous main 876b76a; benchmarks/README.md has the table): ÷ torch.optim.Muon 1.79–1.88 (1024×64),
1.90–1.93 (4096×128), 0.31 (ViT), against 2.20–2.36, 2.18–2.20 and 0.41–0.42 before; ``--threads 2``
1.68–1.78, 1.75–1.90 and 0.19–0.21. The goals are ≤ 2× on the single frames and ≤ 0.5× on the ViT set.

Where the time goes (dispatch trace, 1024×64, one thread, per step): six O(N·n²) products 0.6 ms
(YᵀG, G⊥ = G − Y·YᵀG, G⊥ᵀG⊥, YᵀY and the two of Y_new), two n×n ``eigh`` (the dual iteration and the
direction's msign, whose gradient step also advances the dual) and one ``eigvalsh`` (‖A‖₂) 0.4–0.6 ms,
about 130 small operations; the retraction's (I + lr²AᵀA)^{-1/2} is a truncated series, not an eigh.
torch.optim.Muon runs ten bfloat16 products.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _median_times(steps_fns: list, steps: int) -> list[float]:
    # interleaved (one step of each optimizer per round), so that load from other processes hits
    # all of them alike and the ratios stay meaningful on a shared machine
    for _ in range(3):
        for f in steps_fns:
            f()
    times: list[list[float]] = [[] for _ in steps_fns]
    for _ in range(steps):
        for f, ts in zip(steps_fns, times, strict=True):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--n-iter", type=int, default=None, help="dual iterations per manifold-Muon step (default: ManifoldMuon's)"
    )
    args = ap.parse_args()

    import torch

    from geoarray.manifolds import Stiefel
    from geoarray.optim import ManifoldMuon

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = {"1024×64": (1024, 64, ()), "4096×128": (4096, 128, ()), "ViT 336×49×7": (49, 7, (336,))}
    print(f"torch {torch.__version__}, float32, {args.threads} threads, median of {args.steps} steps")
    header = f"{'weights':<14}{'manifold Muon':>15}{'torch Muon':>12}{'torch Adam':>12}{'÷ Muon':>9}{'÷ Adam':>9}"
    print(header)
    print("-" * len(header))
    for name, (N, n, batch) in cases.items():
        Y0 = torch.linalg.qr(torch.randn(*batch, N, n))[0]
        G = torch.randn(*batch, N, n) * 0.01

        # the optimizer users run: EMA momentum 0.95 (Nesterov), warm-started dual, polar retraction
        opt = ManifoldMuon(lr=0.01, **({} if args.n_iter is None else {"dual_iterations": args.n_iter}))
        st = {"params": {"W": Y0.clone()}}
        st["state"] = opt.init(st["params"], {"W": Stiefel(N, n)})

        def mm_step(st=st, opt=opt, G=G):
            st["params"], st["state"] = opt.update(st["params"], {"W": G}, st["state"])

        mats = list(Y0.reshape(-1, N, n)) if batch else [Y0]
        grads = list(G.reshape(-1, N, n)) if batch else [G]

        def torch_step(cls, kw, mats=mats, grads=grads):
            ps = [torch.nn.Parameter(m.clone()) for m in mats]
            for p, g in zip(ps, grads, strict=True):
                p.grad = g.clone()
            opt = cls(ps, **kw)
            return opt.step

        with torch.no_grad():
            t_mm, t_muon, t_adam = _median_times(
                [mm_step, torch_step(torch.optim.Muon, {"lr": 0.02}), torch_step(torch.optim.Adam, {"lr": 1e-3})],
                args.steps,
            )
        print(
            f"{name:<14}{t_mm * 1e3:>12.2f} ms{t_muon * 1e3:>9.2f} ms{t_adam * 1e3:>9.2f} ms"
            f"{t_mm / t_muon:>9.2f}{t_mm / t_adam:>9.2f}"
        )


if __name__ == "__main__":
    main()

"""ZeRO-1 with geoarray.torch: ``torch.distributed.optim.ZeroRedundancyOptimizer`` shards the optimizer state.

2 CPU processes (gloo), DistributedDataParallel over a model with a Stiefel weight and plain matrices,
``ZeroRedundancyOptimizer(model.parameters(), optimizer_class=C, ...)`` for every geoarray.torch
optimizer class C. Each rank builds C over its own shard of the parameters (so each rank holds the
state of its parameters only) and broadcasts the updated parameters to the other ranks.

Properties: after N steps both ranks hold bit-identical parameters (the same broadcast values), equal
to a single-process run of C on the full batch to 1e-12 (float64: the gradients are all-reduced sums,
which round differently from the single-process ones), the Stiefel weight is a point of the manifold,
and each rank's optimizer holds state for a strict subset of the parameters (the sharding happened).

Resuming across world sizes (``geoarray.torch.checkpoint`` with ``torch.distributed.checkpoint``; ZeRO's
own ``consolidate_state_dict`` keeps torch's per-parameter ``"state"`` only, which geoarray's optimizers
leave empty): a one-process checkpoint after 2 steps resumed on the 2 ZeRO ranks, and the 2 ranks'
checkpoint resumed in one process, both equal the uninterrupted single-process run to 1e-12.

A skipped step (a NaN gradient) is skipped by the rank whose partition holds the NaN only, unless the
optimizers get ``skip_together=True``: then every rank skips it and the weights equal one process's.
"""

from __future__ import annotations

import warnings

import pytest
from test_torch_checkpoint import _load, _save
from test_torch_fsdp import _comm_counter

from _distributed import process_group, run_ranks

N_STEPS = 4
WORLD = 2
# seconds for the whole spawned run (imports of torch and torch.distributed dominate in the children)
TIMEOUT = 240.0

# optimizer class name in geoarray.torch → constructor keywords
OPTIMIZERS = {
    "Adam": {"lr": 0.05},
    "Momentum": {"lr": 0.05},
    "Gradient": {"lr": 0.05},
    "ManifoldMuon": {"lr": 0.02},
}
RESUMED = ("Adam", "ManifoldMuon")  # checkpoints across world sizes (geoarray.torch.checkpoint)


@pytest.fixture(autouse=True)
def _torch_only(backend):
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")


def _model():
    """A Stiefel(6, 3) weight and two plain matrices (ManifoldMuon takes matrices only: no biases)."""
    import torch

    import geoarray as ga
    import geoarray.torch as gt

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            M = ga.Stiefel(6, 3)
            self.Y = gt.ManifoldParameter(M.random(11, xp=torch, dtype=torch.float64), M)
            g = torch.Generator().manual_seed(12)
            self.A = torch.nn.Parameter(torch.randn(6, 4, generator=g, dtype=torch.float64))
            self.B = torch.nn.Parameter(torch.randn(4, 2, generator=g, dtype=torch.float64))

        def forward(self, x):
            return torch.tanh(x @ self.Y.T @ self.A) @ self.B

    return Net()


def _batch():
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randn(8, 2, generator=g, dtype=torch.float64)


def _train(opt, step_module, x, y) -> None:
    _steps(opt, step_module, x, y, N_STEPS)


def _steps(opt, step_module, x, y, n: int) -> None:
    for _ in range(n):
        (step_module(x) - y).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _bench():
    """benchmarks/sharded_step.py, for its per-rank state count."""
    from _examples import load_benchmark

    return load_benchmark("sharded_step")


def _nan_steps(opt, step_module, model, x, y) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skip's NonFiniteGradientWarning
        for k in range(3):
            (step_module(x) - y).square().mean().backward()
            if k == 1:
                model.B.grad[0, 0] = float("nan")
            opt.step()
            opt.zero_grad()


def _zero_worker(rank: int, port: int, out_dir: str) -> None:
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    import geoarray.torch as gt

    with process_group(rank, port, WORLD):
        x, y = _batch()
        shard = slice(rank * 4, (rank + 1) * 4)
        out = {}
        for name, kwargs in OPTIMIZERS.items():
            model = _model()
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=getattr(gt, name), **kwargs)
            _train(opt, DistributedDataParallel(model), x[shard], y[shard])
            local = opt.optim  # this rank's geoarray optimizer over its shard of the parameters
            n_local = sum(len(group["params"]) for group in local.param_groups)
            out[name] = ({k: v.detach().clone() for k, v in model.state_dict().items()}, n_local)
        for name in RESUMED:
            # 1 → 2: the single process's checkpoint, each rank loading the state of its partition
            model = _model()
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=getattr(gt, name), **OPTIMIZERS[name])
            _load(f"{out_dir}/one_{name}", model, opt)
            _steps(opt, DistributedDataParallel(model), x[shard], y[shard], N_STEPS // 2)
            resumed = {k: v.detach().clone() for k, v in model.state_dict().items()}
            # 2 → 1
            model = _model()
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=getattr(gt, name), **OPTIMIZERS[name])
            _steps(opt, DistributedDataParallel(model), x[shard], y[shard], N_STEPS // 2)
            _save(f"{out_dir}/two_{name}", model, opt)
            out[f"resumed {name}"] = resumed
        # a NaN in B's gradient (everywhere, as after DDP's all-reduce) in the second of 3 steps, with each
        # rank deciding the skip over its own partition (the default) and with the ranks agreeing
        for together in (False, True):
            model = _model()
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=gt.Adam, lr=0.05, skip_together=together)
            _nan_steps(opt, DistributedDataParallel(model), model, x[shard], y[shard])
            out[f"nan {together}"] = (
                [(int(c.state.step), int(c.state.skipped)) for cs in opt.optim._cohorts for c in cs],
                {k: v.detach().clone() for k, v in model.state_dict().items()},
            )
        # what ZeRO moves and holds per rank (benchmarks/sharded_step.py's counters), geoarray's Adam and torch's
        for name, cls in (("geoarray", gt.Adam), ("torch", torch.optim.Adam)):
            model = _model()
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, lr=0.05)
            ddp = DistributedDataParallel(model)
            _steps(opt, ddp, x[shard], y[shard], 1)  # the first step builds the state
            comm = _comm_counter(WORLD)
            (ddp(x[shard]) - y[shard]).square().mean().backward()
            with comm:
                opt.step()
            out[f"cost {name}"] = (comm.bytes, _bench()._state_bytes(opt.optim))
        # refused on every rank alike (no rank left waiting in the agreement's all-reduce)
        try:
            ZeroRedundancyOptimizer(
                _model().parameters(), optimizer_class=gt.Adam, lr=0.05, skip_together=True, on_nonfinite="raise"
            )
        except ValueError as exc:
            out["refused"] = str(exc)
        torch.save(out, f"{out_dir}/rank{rank}.pt")


@pytest.fixture(scope="module")
def zero_run(backend, tmp_path_factory):
    """The spawned 2-rank run (once for the module) and its directory, with the one-process checkpoints."""
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")
    import geoarray.torch as gt

    tmp_path = tmp_path_factory.mktemp("zero")
    for name in RESUMED:  # 2 steps in one process, saved for the 2 ranks
        model = _model()
        opt = getattr(gt, name)(model.parameters(), **OPTIMIZERS[name])
        x, y = _batch()
        _steps(opt, model, x, y, N_STEPS // 2)
        _save(tmp_path / f"one_{name}", model, opt)
    return run_ranks(_zero_worker, tmp_path, WORLD, TIMEOUT, "ZeRO"), tmp_path


def test_zero_redundancy_optimizer_shards_every_geoarray_optimizer(zero_run):
    import torch

    import geoarray
    import geoarray.torch as gt

    ranks, tmp_path = zero_run
    x, y = _batch()
    n_params = len(list(_model().parameters()))
    for name, kwargs in OPTIMIZERS.items():
        model = _model()
        _train(getattr(gt, name)(model.parameters(), **kwargs), model, x, y)
        single = {k: v.detach() for k, v in model.state_dict().items()}
        (p0, n0), (p1, n1) = ranks[0][name], ranks[1][name]
        assert n0 + n1 == n_params and 0 < n0 < n_params, f"{name}: the optimizer state was not sharded"
        for k in single:
            assert torch.equal(p0[k], p1[k]), f"{name}: {k} differs between ranks"
            torch.testing.assert_close(p0[k], single[k], rtol=0, atol=1e-12, msg=f"{name}: {k}")
            assert not torch.equal(p0[k], _model().state_dict()[k]), f"{name}: {k} did not train"
        assert geoarray.Stiefel(6, 3).is_point(p0["Y"])
        if name in RESUMED:
            # resumed from the single process's checkpoint on 2 ranks, and from the 2 ranks' in one process:
            # both equal the uninterrupted single-process run to 1e-12
            for out in ranks:
                for k in single:
                    torch.testing.assert_close(
                        out[f"resumed {name}"][k], single[k], rtol=0, atol=1e-12, msg=f"1→2 {name}: {k}"
                    )
            model = _model()
            opt = getattr(gt, name)(model.parameters(), **kwargs)
            _load(tmp_path / f"two_{name}", model, opt)
            _steps(opt, model, x, y, N_STEPS // 2)
            for k, v in model.state_dict().items():
                torch.testing.assert_close(v, single[k], rtol=0, atol=1e-12, msg=f"2→1 {name}: {k}")


def test_a_skipped_step_is_skipped_on_every_zero_rank_with_skip_together(zero_run):
    """A NaN in B's gradient at the second of 3 steps. One process skips the whole step: its one cohort
    counts (2 taken, 1 skipped). Under ZeRO each rank's optimizer decides over its own partition by
    default, so only the rank holding B skips; with ``skip_together=True`` both ranks skip it, count
    (2, 1), and hold the one-process weights to 1e-12 (bit-identical between ranks)."""
    import torch

    import geoarray.torch as gt

    ranks, _ = zero_run
    x, y = _batch()
    model = _model()
    opt = gt.Adam(model.parameters(), lr=0.05)
    _nan_steps(opt, model, model, x, y)
    one = {k: v.detach() for k, v in model.state_dict().items()}
    assert [(int(c.state.step), int(c.state.skipped)) for cs in opt._cohorts for c in cs] == [(2, 1)]

    apart = sorted(counts for out in ranks for counts in out["nan False"][0])
    assert apart == [(2, 1), (3, 0)], f"each rank decides over its partition: (steps, skipped) {apart}"
    for out in ranks:
        counts, weights = out["nan True"]
        assert counts == [(2, 1)], f"(steps, skipped) with skip_together: {counts}, one process: (2, 1)"
        for k in one:
            assert torch.equal(weights[k], ranks[0]["nan True"][1][k]), f"{k} differs between ranks"
            torch.testing.assert_close(weights[k], one[k], rtol=0, atol=1e-12, msg=f"skip_together: {k}")
        assert "on_nonfinite='raise'" in out["refused"]


def test_zero_moves_and_holds_what_it_does_for_torch_adam(zero_run):
    """Under ZeroRedundancyOptimizer each rank broadcasts the new weights of its partition after its step,
    so a geoarray.torch.Adam step moves exactly the bytes a torch.optim.Adam step moves, and each rank's
    state — Brantner's Adam keeps its moments in g^hor, n×n + (N−n)×n numbers per frame — has the bytes of
    torch's two moments up to the step counters (torch: a float32 ``step`` per parameter; geoarray: an
    int64 step and skip count per cohort), at most 64 bytes here. The same counters make the table of
    ``benchmarks/sharded_step.py --parallel zero``."""
    ranks, _ = zero_run
    for rank, out in enumerate(ranks):
        (ours, ours_state), (theirs, theirs_state) = out["cost geoarray"], out["cost torch"]
        assert ours == theirs > 0, f"rank {rank}: step bytes geoarray {ours}, torch {theirs}"
        assert 0 < ours_state and abs(ours_state - theirs_state) <= 64, (rank, ours_state, theirs_state)

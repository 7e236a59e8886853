"""FSDP2 with geoarray.torch: ``geoarray.torch.fully_shard`` (torch's ``fully_shard``, manifolds kept).

2 CPU processes (gloo), a model with a ``(8, 16, 4)`` stack of Stiefel frames (sharded along the
stack: 4 whole frames per rank, stepped where they are), a ``64×8`` Stiefel weight (sharded by rows:
32 rows per rank, so it is gathered to its owner rank for its step) and a plain ``8×6`` matrix, every
parameter a ``Shard(0)`` DTensor; each rank takes half of the batch. Properties, after 4 steps in float64,
for Adam, PaperAdam, SGD (momentum), ManifoldMuon and a ``geoarray.torch.Optimizer`` around a core:

* the parameters gathered from the shards equal a single-process run of the same optimizer on the
  whole batch to 1e-12 (the gradients are reduce-scattered means, which round differently), and
  the Stiefel weights are points of their manifolds;
* the optimizer state is sharded where the update allows it: rank r holds the state of frames
  4r…4r+3 only, equal to those frames' state in the single process to 1e-12, and of its rows of
  the plain matrix under the element-wise rules; the 64×8 weight's state (and, under Muon, the
  plain matrix's) lives on its owner only, equal to the single process's; a core of one's own gets
  everything gathered on every rank, its state whole and bit-identical on both;
* the bytes a step moves to each rank are exactly the gathers and scatters of the owned matrices (and
  a 4-byte flag): nothing for the frames (counted by benchmarks/sharded_step.py's counter of the
  collectives);
* a per-rank ``state_dict`` resumed after 2 steps gives the same next 2 steps bit for bit;
* a non-finite gradient in one rank's shard only skips the step on every rank (a rank stepping alone
  would leave the model's parts at different steps);
* without host reads (``geoarray.set_host_reads("never")``), a step beyond the retraction's doubling
  budget on one rank's frames only is skipped on every rank too, and so is a NaN in one rank's gradient
  (parameters unchanged, the step and skip counters equal on both ranks);
* under ``torch.amp.GradScaler`` without host reads, an inf in one rank's shard skips that step on every
  rank, and the scaled steps equal the unscaled ones to 1e-12;
* FSDP2's meta-device initialisation (``to_empty``) keeps the manifolds, and ``geoarray.torch.fully_shard``
  shards a column-major frame (QR's), which torch's refuses;
* torch's own ``fully_shard`` on a ``geoarray.torch.nn`` module keeps its manifolds too (the module's
  parameter containers put them back), with or without a ``MixedPrecisionPolicy``: 3 ``PaperAdam`` steps
  equal one process's to 1e-12, and under a float32 policy the float64 weights stay on Stiefel to 1e-12;
* the FSDP2 example of docs/frameworks.md (moved from the README) runs on 2 ranks and prints what it claims.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest

from _distributed import leave, process_group, run_ranks

N_STEPS = 4
WORLD = 2
TIMEOUT = 240.0  # seconds for one spawned run (imports of torch.distributed dominate)
B, PER_RANK = 8, 4  # frames in the stack, frames per rank
README = Path(__file__).resolve().parents[1] / "docs" / "frameworks.md"  # the FSDP2 example (was in README.md)

# geoarray.torch class → constructor keywords; "Optimizer" wraps a core of its own (not known to separate)
OPTIMIZERS = {
    "Adam": {"lr": 0.02},
    "PaperAdam": {"lr": 0.02},
    "SGD": {"lr": 0.05, "momentum": 0.9},
    "ManifoldMuon": {"lr": 0.02},
    "Optimizer": {},
}
# where each parameter cut inside a matrix is stepped: the rank that owns it (the least loaded in the
# order of the parameters: W, the first, on rank 0; then A, under Muon, on rank 1), or on every rank
# ("all": a core of one's own, not known to treat parameters independently, gathers everything)
OWNERS = {
    "Adam": {"W": 0},
    "PaperAdam": {"W": 0},
    "SGD": {"W": 0},
    "ManifoldMuon": {"W": 0, "A": 1},
    "Optimizer": {"F": "all", "W": "all", "A": "all"},
}


@pytest.fixture(autouse=True)
def _torch_only(backend):
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")


def _model():
    import torch

    import geoarray as ga
    import geoarray.torch as gt

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            M, S = ga.Stiefel(16, 4), ga.Stiefel(64, 8)
            # FSDP2 takes contiguous parameters only (QR returns column-major frames)
            self.F = gt.ManifoldParameter(M.random(1, xp=torch, batch_shape=(B,), dtype=torch.float64).contiguous(), M)
            self.W = gt.ManifoldParameter(S.random(2, xp=torch, dtype=torch.float64).contiguous(), S)
            g = torch.Generator().manual_seed(3)
            self.A = torch.nn.Parameter(torch.randn(8, 6, generator=g, dtype=torch.float64))

        def forward(self, x):
            h = torch.einsum("bi,kin->bkn", x, self.F).reshape(x.shape[0], 4 * B)
            return torch.tanh(torch.cat([h, h], 1) @ self.W) @ self.A

    return Net()


def _optimizer(name, params):
    import geoarray as ga
    import geoarray.torch as gt

    if name == "Optimizer":
        return gt.Optimizer(params, ga.optim.Adam(lr=0.02))
    return getattr(gt, name)(params, **OPTIMIZERS[name])


def _batch():
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randn(8, 6, generator=g, dtype=torch.float64)


def _train(opt, model, x, y, steps) -> None:
    for _ in range(steps):
        (model(x) - y).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _state(opt, p) -> dict:
    """``opt.state[p]`` as plain tensors (horizontal elements as their fields), for torch.save."""
    import optree

    return {k: [t.clone() for t in optree.tree_leaves(v)] for k, v in opt.state[p].items() if k != "step"}


def _comm_counter(world: int):
    """benchmarks/sharded_step.py's counter of the bytes the collectives move per rank."""
    from _examples import load_benchmark

    return load_benchmark("sharded_step")._Comm(world)


def _fsdp_worker(rank: int, port: int, out_dir: str) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import geoarray.torch as gt

    with process_group(rank, port, WORLD):
        mesh = init_device_mesh("cpu", (WORLD,))
        x, y = _batch()
        x, y = x[rank * 4 : (rank + 1) * 4], y[rank * 4 : (rank + 1) * 4]
        out = {}
        for name in OPTIMIZERS:
            model = gt.fully_shard(_model(), mesh=mesh)
            opt = _optimizer(name, model.parameters())
            _train(opt, model, x, y, 1)  # the first step also gathers the weights to build the state
            comm = _comm_counter(WORLD)
            for _ in range(N_STEPS - 1):
                (model(x) - y).square().mean().backward()
                with comm:
                    opt.step()
                opt.zero_grad()
            out[name] = {
                "step_bytes": comm.bytes / (N_STEPS - 1),
                "params": {k: v.full_tensor() for k, v in model.state_dict().items()},
                "local": {k: (tuple(p.to_local().shape),) for k, p in model.named_parameters()},
                "state": {k: _state(opt, p) for k, p in model.named_parameters()},
            }
        # resume: 2 steps, a per-rank state_dict into a fresh model and optimizer, 2 more steps
        model = gt.fully_shard(_model(), mesh=mesh)
        opt = gt.Adam(model.parameters(), lr=0.02)
        _train(opt, model, x, y, 2)
        out["two_steps"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
        saved_model, saved_opt = model.state_dict(), opt.state_dict()
        resumed = gt.fully_shard(_model(), mesh=mesh)
        resumed.load_state_dict(saved_model)
        opt2 = gt.Adam(resumed.parameters(), lr=0.02)
        opt2.load_state_dict(saved_opt)
        _train(opt2, resumed, x, y, 2)
        out["resumed"] = {k: v.full_tensor() for k, v in resumed.state_dict().items()}
        out["manifolds"] = [repr(p.manifold) for p in resumed.parameters() if hasattr(p, "manifold")]
        # FSDP2's initialisation on the meta device: to_empty registers new parameters, which keep their manifolds
        import geoarray as ga

        meta = torch.nn.Module()
        meta.F = gt.ManifoldParameter(torch.empty(B, 16, 4, device="meta"), ga.Stiefel(16, 4), check=False)
        meta.W = gt.ManifoldParameter(torch.empty(64, 8, device="meta"), ga.Stiefel(64, 8), check=False)
        gt.fully_shard(meta, mesh=mesh).to_empty(device="cpu")
        out["meta_manifolds"] = [repr(p.manifold) for p in meta.parameters() if hasattr(p, "manifold")]
        # a NaN in rank 0's shard of the frames' gradient only: every rank skips the step
        model = gt.fully_shard(_model(), mesh=mesh)
        opt = gt.Adam(model.parameters(), lr=0.02)
        _train(opt, model, x, y, 1)
        out["before"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
        (model(x) - y).square().mean().backward()
        if rank == 0:
            model.F.grad.to_local()[0, 0, 0] = float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the core's NonFiniteGradientWarning
            opt.step()
        out["after"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
        # without host reads, a step beyond the retraction's doubling budget on rank 0's frames only
        # (their gradient ×10³ there): rank 0's core skips it, and so must every rank
        model = gt.fully_shard(_model(), mesh=mesh)
        opt = gt.SGD(model.parameters(), lr=0.05)
        _train(opt, model, x, y, 1)
        out["budget_before"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
        previous = ga.set_host_reads("never")
        try:
            (model(x) - y).square().mean().backward()
            if rank == 0:
                model.F.grad.to_local().mul_(1e3)
            opt.step()
            opt.zero_grad()
            # and a NaN in rank 0's frames' gradient, without host reads (masked, not read)
            (model(x) - y).square().mean().backward()
            if rank == 0:
                model.F.grad.to_local()[0, 0, 0] = float("nan")
            opt.step()
        finally:
            ga.set_host_reads(previous)
        out["budget_after"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
        state = opt._cohorts[0][0].state
        out["budget_counts"] = (int(state.step), int(state.skipped))
        # under torch.amp.GradScaler without host reads, an inf in rank 0's frames' gradient at the second of
        # three steps: the scaler's flag covers every rank, so every rank skips that step (on the device)
        previous = ga.set_host_reads("never")
        try:
            model = gt.fully_shard(_model(), mesh=mesh)
            opt = gt.Adam(model.parameters(), lr=0.02)
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
            for t in range(3):
                scaler.scale((model(x) - y).square().mean()).backward()
                if t == 1 and rank == 0:
                    model.F.grad.to_local()[0, 0, 0] = float("inf")
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
        finally:
            ga.set_host_reads(previous)
        out["scaled"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
        out["scaled_scale"] = scaler.get_scale()
        # torch's own fully_shard on a geoarray.torch.nn module (its manifolds had been dropped: Euclidean steps
        # took the weights 0.16 off Stiefel in 5 steps), plain and with a float32 MixedPrecisionPolicy
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from torch.distributed.fsdp import fully_shard as torch_fully_shard

        xa, ya = _attention_batch()
        xa, ya = xa[rank * 4 : (rank + 1) * 4], ya[rank * 4 : (rank + 1) * 4]
        for key, policy in (("torch_fully_shard", None), ("torch_fully_shard_mp", torch.float32)):
            attn = gt.nn.MultiHeadAttention(16, 4, seed=3, dtype=torch.float64)
            kwargs = {} if policy is None else {"mp_policy": MixedPrecisionPolicy(param_dtype=policy)}
            torch_fully_shard(attn, mesh=mesh, **kwargs)
            out[key + "_manifolds"] = [repr(getattr(p, "manifold", None)) for p in attn.parameters()]
            _train_attention(gt.PaperAdam(attn.parameters(), lr=0.02), attn, xa, ya)
            out[key] = {k: v.full_tensor() for k, v in attn.state_dict().items()}
        # geoarray.torch.fully_shard takes a column-major frame (QR's), which torch's refuses
        net = torch.nn.Module()
        net.F = gt.ManifoldParameter(
            ga.Stiefel(16, 4).random(1, xp=torch, batch_shape=(B,), dtype=torch.float64), ga.Stiefel(16, 4)
        )
        assert not net.F.is_contiguous()
        gt.fully_shard(net, mesh=mesh)
        out["column_major"] = (tuple(net.F.to_local().shape), repr(net.F.manifold))
        torch.save(out, f"{out_dir}/rank{rank}.pt")


def _attention_batch():
    import torch

    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 3, 16, generator=g, dtype=torch.float64)
    return x, torch.randn(8, 3, 16, generator=g, dtype=torch.float64)


def _train_attention(opt, attn, x, y) -> None:
    for _ in range(3):
        (attn(x).double() - y).square().mean().backward()
        opt.step()
        opt.zero_grad()


def test_fsdp2_manifold_parameters_step_like_one_process_with_sharded_state(tmp_path):
    import optree
    import torch

    import geoarray

    ranks = run_ranks(_fsdp_worker, tmp_path, WORLD, TIMEOUT, "FSDP2")
    x, y = _batch()
    for name in OPTIMIZERS:
        model = _model()
        opt = _optimizer(name, model.parameters())
        _train(opt, model, x, y, N_STEPS)
        single = {k: v.detach() for k, v in model.state_dict().items()}
        start = _model().state_dict()
        for rank, out in enumerate(ranks):
            got = out[name]
            for k in single:
                torch.testing.assert_close(got["params"][k], single[k], rtol=0, atol=1e-12, msg=f"{name}: {k}")
                assert not torch.equal(got["params"][k], start[k]), f"{name}: {k} did not train"
            assert geoarray.Stiefel(64, 8).is_point(got["params"]["W"]), name
            assert geoarray.Stiefel(16, 4).is_point(got["params"]["F"]), name
            # the shards are FSDP2's Shard(0) chunks
            assert got["local"]["F"][0] == (PER_RANK, 16, 4) and got["local"]["W"][0] == (32, 8), name
            # rank r holds the state of its frames only, equal to theirs in the single process
            ref_F = _state(opt, model.F)
            assert ref_F, f"{name}: no state for the frames"
            # (a core of one's own is not known to separate the frames: gathered, whole state)
            n = B if name == "Optimizer" else PER_RANK
            frames = slice(rank * n, (rank + 1) * n) if n < B else slice(None)
            for key, leaves in ref_F.items():
                mine = got["state"]["F"][key]
                for a, b in zip(mine, leaves, strict=True):
                    assert a.shape[0] == n, f"{name}: {key} of the frames has {a.shape[0]} frames, expected {n}"
                    torch.testing.assert_close(a, b[frames], rtol=0, atol=1e-12, msg=f"{name}: state {key}")
            # a weight cut inside a matrix: its owner holds its whole state, equal to the single process's;
            # the other rank an empty batch. An unknown core: whole on every rank, bit-identical
            for k in ("W", "A"):
                owner = OWNERS[name].get(k)
                ref = _state(opt, getattr(model, k))
                for key, leaves in ref.items() if owner is not None else ():
                    for a, c in zip(got["state"][k][key], leaves, strict=True):
                        if owner == "all":
                            torch.testing.assert_close(a, c, rtol=0, atol=1e-12, msg=f"{name}: state {key} of {k}")
                        elif owner == rank:
                            torch.testing.assert_close(a, c, rtol=0, atol=1e-12, msg=f"{name}: state {key} of {k}")
                        else:
                            assert a.numel() == 0, f"{name}: rank {rank} holds state {key} of {k}, owned by {owner}"
            if name == "Optimizer":
                for k in ("F", "W", "A"):
                    for key, leaves in got["state"][k].items():
                        for a, b in zip(leaves, ranks[0][name]["state"][k][key], strict=True):
                            assert torch.equal(a, b), f"{name}: the state {key} of {k} differs between ranks"
            # the plain matrix under element-wise rules: the state of this rank's rows
            if OWNERS[name].get("A") is None:
                rows = {leaf.shape[0] for leaf in optree.tree_leaves(got["state"]["A"])}
                assert rows == {4}, f"{name}: state of A has rows {rows}, expected 4"
        # the bytes a step moves to each rank: for a matrix of S bytes owned by rank o, o receives (W−1)/W of
        # weight and gradient (gather), every other rank its 1/W of the new value (scatter); parameters
        # gathered on every rank: (W−1)/W of weight and gradient (all-gather); where a rank steps its own
        # parts, the 4-byte finiteness flag (all-reduce: 2(W−1)/W of it) — nothing for the frames
        w = WORLD
        for rank, out in enumerate(ranks):
            expected = 0.0
            for k, owner in OWNERS[name].items():
                size = single[k].numel() * 8
                if owner == "all":
                    expected += 2 * (w - 1) / w * size
                else:
                    expected += 2 * (w - 1) / w * size if owner == rank else size / w
            expected += 2 * (w - 1) / w * 4 if name != "Optimizer" else 0
            got = out[name]["step_bytes"]
            assert got == expected, f"{name}: a step moved {got} bytes to rank {rank}, expected {expected}"
    import geoarray.torch as gt

    attn = gt.nn.MultiHeadAttention(16, 4, seed=3, dtype=torch.float64)
    attention_start = {k: v.detach().clone() for k, v in attn.state_dict().items()}
    _train_attention(gt.PaperAdam(attn.parameters(), lr=0.02), attn, *_attention_batch())
    attention_single = {k: v.detach() for k, v in attn.state_dict().items()}
    # resume from a per-rank state_dict: the same computation, bit for bit
    for out in ranks:
        for k, v in out["resumed"].items():
            assert torch.equal(v, out["Adam"]["params"][k]), f"resumed {k}"
        for k, v in out["after"].items():
            assert torch.equal(v, out["before"][k]), f"{k} changed in a step with a non-finite gradient on rank 0"
        for k, v in out["budget_after"].items():
            assert torch.equal(v, out["budget_before"][k]), f"{k} changed in a step beyond rank 0's doubling budget"
        assert out["budget_counts"] == (1, 2), f"steps, skipped: {out['budget_counts']}, expected (1, 2) on every rank"
        # the scaled run took steps 1 and 3: the same computation as Adam's first two unscaled steps (the scale
        # is a power of two), compared to a tolerance since the scaled gradients pass through other kernels
        assert out["scaled_scale"] == 2.0**9, "the scale did not back off on every rank"
        for k, v in out["scaled"].items():
            torch.testing.assert_close(v, out["two_steps"][k], rtol=0, atol=1e-12, msg=f"GradScaler: {k}")
        assert out["meta_manifolds"] == [repr(geoarray.Stiefel(16, 4)), repr(geoarray.Stiefel(64, 8))]
        assert out["manifolds"] == [repr(geoarray.Stiefel(16, 4)), repr(geoarray.Stiefel(64, 8))]
        # torch's fully_shard on a geoarray.torch.nn module: manifolds kept; the steps equal one process's
        # (1e-12), and under a float32 MixedPrecisionPolicy the float64 weights stay on Stiefel to 1e-12
        assert out["column_major"] == ((PER_RANK, 16, 4), repr(geoarray.Stiefel(16, 4)))
        for key in ("torch_fully_shard", "torch_fully_shard_mp"):
            assert out[key + "_manifolds"] == [repr(geoarray.Stiefel(16, 4))] * 3, key
        for k, v in out["torch_fully_shard_mp"].items():
            assert geoarray.Stiefel(16, 4).is_point(v, atol=1e-12), f"mixed precision: {k}"
            assert not torch.equal(v, attention_start[k]), f"mixed precision: {k} did not train"
        for k, v in out["torch_fully_shard"].items():
            torch.testing.assert_close(v, attention_single[k], rtol=0, atol=1e-12, msg=f"torch's fully_shard: {k}")


def _readme_block() -> str:
    blocks = re.findall(r"```python\n(# runs in the fsdp session.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "docs/frameworks.md has one FSDP2 example"
    return blocks[0]


def _readme_worker(rank: int, port: int, out_dir: str) -> None:
    import contextlib
    import io

    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_readme_block(), str(README), "exec"), {"__name__": "readme"})
    torch.save({"printed": out.getvalue()}, f"{out_dir}/rank{rank}.pt")
    leave(barrier=False)  # the example destroyed its process group; exit without the objects' teardown


def test_readme_fsdp2_example_runs_on_two_ranks(tmp_path):
    block = _readme_block()
    claimed = [c.strip() for c in re.findall(r"^\s*print\(.*\)\s*#\s*(.+)$", block, flags=re.M)]
    assert claimed
    for out in run_ranks(_readme_worker, tmp_path, WORLD, TIMEOUT, "README FSDP2"):
        printed = [line.strip() for line in out["printed"].splitlines() if line.strip()]
        assert printed == claimed, f"the README's FSDP2 example prints {printed}, claims {claimed}"

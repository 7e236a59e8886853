"""HSDP — FSDP2 over a 2-D mesh (2 replicas × 2 shards) — with geoarray.torch, on 4 gloo CPU processes.

``geoarray.torch.fully_shard(model, mesh=init_device_mesh("cpu", (2, 2)))``: every parameter is a
DTensor placed ``(Replicate(), Shard(0))`` — a copy per replica group, cut in two within it. The
model of ``tests/test_torch_fsdp.py``; each of the 4 ranks takes a quarter of the batch. Properties,
after 4 steps in float64, for Adam and ManifoldMuon:

* the parameters equal a single-process run on the whole batch to 1e-12 and stay on their manifolds,
  and the two replicas of each shard are bit-identical (the same reduced gradients, the same update);
* the frames' optimizer state is sharded within each replica group: the rank at shard coordinate s
  holds frames 4s…4s+3 only; the 64×8 weight, cut by rows, is gathered to its owner within each
  replica group (shard 0), which alone holds its state, equal to the single process's;
* checkpoints (``geoarray.torch.checkpoint`` through ``torch.distributed.checkpoint``) move between
  this 4-rank 2-D run and one process: resumed from a one-process checkpoint and saved for one process,
  both equal the uninterrupted one-process run to 1e-12; the same for 1-D FSDP over the 4 ranks with
  three 64×8 weights owned by ranks 0, 1 and 2 (whose cohort layouts differ from rank to rank: the
  checkpoint's collectives must still pair up).
"""

from __future__ import annotations

import pytest
from test_torch_checkpoint import _leaves, _load, _save
from test_torch_fsdp import _batch, _model, _optimizer, _train

from _distributed import process_group, run_ranks

WORLD, REPLICAS, SHARDS = 4, 2, 2
NAMES = ("Adam", "ManifoldMuon")
N_STEPS, HALF = 4, 2
TIMEOUT = 240.0


@pytest.fixture(autouse=True)
def _torch_only(backend):
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")


def _tall():
    """Three Stiefel(64, 8) weights (a model of the test's batch: 16 inputs, 6 outputs)."""
    import torch

    import geoarray as ga
    import geoarray.torch as gt

    class Tall(torch.nn.Module):
        def __init__(self):
            super().__init__()
            S = ga.Stiefel(64, 8)
            for k in range(3):
                setattr(
                    self, f"W{k}", gt.ManifoldParameter(S.random(20 + k, xp=torch, dtype=torch.float64).contiguous(), S)
                )

        def forward(self, x):
            h = torch.cat([x, x, x, x], 1)
            return sum(torch.tanh(h @ getattr(self, f"W{k}")) for k in range(3))[:, :6]

    return Tall()


def _frames_state(opt, F, name: str) -> list:
    """Adam's first moment of the frames (a horizontal element: its A and B blocks), or ManifoldMuon's buffer."""
    import optree

    return [t.clone() for t in optree.tree_leaves(opt.state[F]["exp_avg" if name == "Adam" else "momentum_buffer"])]


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import geoarray.torch as gt

    with process_group(rank, port, WORLD):
        mesh = init_device_mesh("cpu", (REPLICAS, SHARDS), mesh_dim_names=("replicate", "shard"))
        x, y = _batch()
        x, y = x[rank * 2 : (rank + 1) * 2], y[rank * 2 : (rank + 1) * 2]
        out = {"shard": mesh.get_local_rank("shard")}
        for name in NAMES:
            model = gt.fully_shard(_model(), mesh=mesh)
            opt = _optimizer(name, model.parameters())
            _train(opt, model, x, y, N_STEPS)
            out[name] = {
                "params": {k: v.full_tensor() for k, v in model.state_dict().items()},
                "local": {k: v.to_local().clone() for k, v in model.state_dict().items()},
                "placements": [str(p.placements) for p in model.parameters()],
                "frames_state": _frames_state(opt, model.F, name),
                "W_state": _frames_state(opt, model.W, name),
            }
            # 1 → 4: the one-process checkpoint; 4 → 1: saved after 2 steps here
            model = gt.fully_shard(_model(), mesh=mesh)
            opt = _optimizer(name, model.parameters())
            _load(f"{out_dir}/one_{name}", model, opt)
            _train(opt, model, x, y, HALF)
            out[name]["resumed"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
            model = gt.fully_shard(_model(), mesh=mesh)
            opt = _optimizer(name, model.parameters())
            _train(opt, model, x, y, HALF)
            _save(f"{out_dir}/four_{name}", model, opt)
        # 1-D FSDP over the 4 ranks, three 64×8 weights cut by rows (owners: ranks 0, 1, 2): each rank's
        # layout stacks the weights it owns apart from those it does not, differently on each rank
        flat = init_device_mesh("cpu", (WORLD,))
        model = gt.fully_shard(_tall(), mesh=flat)
        opt = gt.Adam(model.parameters(), lr=0.02)
        _load(f"{out_dir}/one_tall", model, opt)
        _train(opt, model, x, y, HALF)
        out["tall resumed"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
        model = gt.fully_shard(_tall(), mesh=flat)
        opt = gt.Adam(model.parameters(), lr=0.02)
        _train(opt, model, x, y, HALF)
        _save(f"{out_dir}/four_tall", model, opt)
        torch.save(out, f"{out_dir}/rank{rank}.pt")


def test_hsdp_on_a_2d_mesh_steps_like_one_process_and_checkpoints_across_world_sizes(tmp_path):
    import torch

    import geoarray

    x, y = _batch()
    reference, states = {}, {}
    for name in NAMES:
        model = _model()
        opt = _optimizer(name, model.parameters())
        _train(opt, model, x, y, N_STEPS)
        reference[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        states[name] = _frames_state(opt, model.F, name)
        states[name, "W"] = _frames_state(opt, model.W, name)
        model = _model()
        opt = _optimizer(name, model.parameters())
        _train(opt, model, x, y, HALF)
        _save(tmp_path / f"one_{name}", model, opt)

    model = _tall()
    opt = _optimizer("Adam", model.parameters())
    _train(opt, model, x, y, N_STEPS)
    reference["tall"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model = _tall()
    opt = _optimizer("Adam", model.parameters())
    _train(opt, model, x, y, HALF)
    _save(tmp_path / "one_tall", model, opt)

    ranks = run_ranks(_worker, tmp_path, WORLD, TIMEOUT, "HSDP")

    # 1-D FSDP on 4 ranks, owners 0, 1, 2 of the three tall weights: 1 → 4 and 4 → 1
    for out in ranks:
        for k, v in out["tall resumed"].items():
            torch.testing.assert_close(v, reference["tall"][k], rtol=0, atol=1e-12, msg=f"1→4 tall: {k}")
    model = _tall()
    opt = _optimizer("Adam", model.parameters())
    _load(tmp_path / "four_tall", model, opt)
    _train(opt, model, x, y, HALF)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, reference["tall"][k], rtol=0, atol=1e-12, msg=f"4→1 tall: {k}")

    for name in NAMES:
        ref = reference[name]
        for rank, out in enumerate(ranks):
            got = out[name]
            assert all("Replicate()" in p and "Shard(dim=0)" in p for p in got["placements"]), got["placements"]
            for k in ref:
                torch.testing.assert_close(got["params"][k], ref[k], rtol=0, atol=1e-12, msg=f"{name}: {k}")
                torch.testing.assert_close(got["resumed"][k], ref[k], rtol=0, atol=1e-12, msg=f"1→4 {name}: {k}")
            assert geoarray.Stiefel(16, 4).is_point(got["params"]["F"]) and geoarray.Stiefel(64, 8).is_point(
                got["params"]["W"]
            ), name
            s = out["shard"]
            for a, b in zip(got["frames_state"], states[name], strict=True):
                assert a.shape[0] == 4, f"{name}: rank {rank} holds the state of {a.shape[0]} frames, expected 4"
                torch.testing.assert_close(a, b[4 * s : 4 * s + 4], rtol=0, atol=1e-12, msg=f"{name}: frames' state")
            # the 64×8 weight, cut by rows: stepped whole by its owner in each replica group (shard 0,
            # the least loaded), which alone holds its state
            for a, b in zip(got["W_state"], states[name, "W"], strict=True):
                if s == 0:
                    torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=f"{name}: the owner's state of W")
                else:
                    assert a.numel() == 0, f"{name}: rank {rank} holds state of W {tuple(a.shape)}, owned by shard 0"
        # the replicas (ranks s and 2 + s) of each shard: bit-identical
        for s in range(SHARDS):
            for k, v in ranks[s][name]["local"].items():
                assert torch.equal(v, ranks[SHARDS + s][name]["local"][k]), f"{name}: replicas of shard {s} of {k}"
        # 4 → 1
        model = _model()
        opt = _optimizer(name, model.parameters())
        _load(tmp_path / f"four_{name}", model, opt)
        _train(opt, model, x, y, HALF)
        for k, v in model.state_dict().items():
            torch.testing.assert_close(v, ref[k], rtol=0, atol=1e-12, msg=f"4→1 {name}: {k}")
        assert len(_leaves(opt)) > 0

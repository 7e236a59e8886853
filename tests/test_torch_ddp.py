"""DistributedDataParallel with geoarray.torch: 2 CPU processes (gloo) train a small Stiefel model.

Property: after N steps both ranks hold bit-identical parameters (the update is a deterministic
function of the all-reduced gradients), equal to a single-process run on the concatenated batch to
1e-12 (float64), and the Stiefel weight is still a point of the manifold.
"""

from __future__ import annotations

import pytest

from _distributed import process_group, run_ranks

N_STEPS = 5
WORLD = 2
# seconds for the whole spawned run; measured 12–17 s on 2 busy cores, most of it imports in the
# children (torch, and torch._dynamo, which DistributedDataParallel's constructor imports)
TIMEOUT = 180.0


@pytest.fixture(autouse=True)
def _torch_only(backend):
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")


def _model():
    import torch

    import geoarray.nn as gnn
    import geoarray.torch as gt

    return gt.nn.Chain(gnn.StiefelLayer(6, 3), gnn.Dense(6, 2, "tanh"), seed=11, dtype=torch.float64)


def _batch():
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randn(8, 2, generator=g, dtype=torch.float64)


def _train(model, step_module, x, y):
    import geoarray.torch as gt

    opt = gt.Adam(model.parameters(), lr=0.05)
    for _ in range(N_STEPS):
        loss = (step_module(x) - y).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _ddp_worker(rank: int, port: int, out_dir: str) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    with process_group(rank, port, WORLD):
        model = _model()
        x, y = _batch()
        shard = slice(rank * 4, (rank + 1) * 4)
        params = _train(model, DistributedDataParallel(model), x[shard], y[shard])
        torch.save(params, f"{out_dir}/rank{rank}.pt")


def test_ddp_ranks_agree_bitwise_and_equal_the_single_process_run(tmp_path):
    import torch

    import geoarray

    ranks = run_ranks(_ddp_worker, tmp_path, WORLD, TIMEOUT, "DDP")

    model = _model()
    x, y = _batch()
    single = _train(model, model, x, y)

    assert ranks[0].keys() == single.keys()
    for k in single:
        assert torch.equal(ranks[0][k], ranks[1][k]), f"{k} differs between ranks"
        torch.testing.assert_close(ranks[0][k], single[k], rtol=0, atol=1e-12)
    assert geoarray.Stiefel(6, 3).is_point(ranks[0]["params.0.Y"])
    assert not torch.equal(ranks[0]["params.0.Y"], _model().state_dict()["params.0.Y"])  # it trained

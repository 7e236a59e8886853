"""Resuming on another number of ranks: ``geoarray.torch.checkpoint`` with ``torch.distributed.checkpoint``.

The model of ``tests/test_torch_fsdp.py`` (a ``(8, 16, 4)`` stack of Stiefel frames, stepped where its
shards are; a ``64×8`` Stiefel weight, gathered to its owner rank; a plain ``8×6`` matrix) under
Adam, PaperAdam and SGD with momentum (state per frame, per owned matrix and per row), ManifoldMuon
(the plain matrix owned too: its Muon state) and a ``geoarray.torch.Optimizer`` around a core of its
own (everything gathered on every rank). Properties, in float64:

* **1 → 2**: one process (no FSDP) takes 2 steps and saves model and optimizer with ``dcp.save``; 2 gloo
  ranks under ``fully_shard`` load it into fresh models and optimizers and take 2 more steps. Right
  after loading, rank r holds the state of frames 4r…4r+3 and the owner the whole state of its
  matrices, each *bit-identical* to the saving process's (loading moves numbers, it computes nothing);
  after the 2 steps the parameters equal an uninterrupted 4-step run in one process to 1e-12 (the
  2-rank steps round differently: reduce-scattered gradients, batched updates of 4 frames) and are
  points of their manifolds.
* **2 → 1**: the 2 ranks take 2 steps under ``fully_shard`` and save; one process without FSDP loads
  it and takes 2 more: again equal to the uninterrupted run to 1e-12. Loading the 2-rank checkpoint
  in one process gives the state the 2 ranks held, bit for bit.
* a checkpoint of another optimizer or of other param groups is refused with a ``ValueError`` naming
  it, and the optimizer is left as it was.
"""

from __future__ import annotations

import warnings

import pytest
from test_torch_fsdp import TIMEOUT, WORLD, _batch, _model, _optimizer, _train

from _distributed import process_group, run_ranks

NAMES = ("Adam", "PaperAdam", "SGD", "ManifoldMuon", "Optimizer")
HALF = 2  # steps before the checkpoint, and after it


@pytest.fixture(autouse=True)
def _torch_only(backend):
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")


def _save(path, model, opt) -> None:
    import torch.distributed.checkpoint as dcp

    from geoarray.torch.checkpoint import get_optimizer_state_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp without a process group: "assuming ... a single process"
        dcp.save({"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path)


def _load(path, model, opt) -> None:
    import torch.distributed.checkpoint as dcp

    from geoarray.torch.checkpoint import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])


def _leaves(opt) -> list:
    """The cohort state's tensors, as this rank holds them."""
    import optree

    return [t.clone() for cohorts in opt._cohorts for c in cohorts for t in optree.tree_leaves(c.state)]


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import geoarray.torch as gt

    with process_group(rank, port, WORLD):
        mesh = init_device_mesh("cpu", (WORLD,))
        x, y = _batch()
        x, y = x[rank * 4 : (rank + 1) * 4], y[rank * 4 : (rank + 1) * 4]
        out = {}
        for name in NAMES:
            # 1 → 2: the checkpoint the single process wrote, into a sharded model
            model = gt.fully_shard(_model(), mesh=mesh)
            opt = _optimizer(name, model.parameters())
            _load(f"{out_dir}/one_{name}", model, opt)
            loaded = _leaves(opt)
            _train(opt, model, x, y, HALF)
            resumed = {k: v.full_tensor() for k, v in model.state_dict().items()}
            # 2 → 1: 2 sharded steps, saved for the single process
            model = gt.fully_shard(_model(), mesh=mesh)
            opt = _optimizer(name, model.parameters())
            _train(opt, model, x, y, HALF)
            _save(f"{out_dir}/two_{name}", model, opt)
            out[name] = {"loaded": loaded, "resumed": resumed, "saved": _leaves(opt)}
        torch.save(out, f"{out_dir}/rank{rank}.pt")


def test_checkpoint_resumes_on_another_world_size(tmp_path):
    import torch

    import geoarray

    x, y = _batch()
    reference, single_state = {}, {}
    for name in NAMES:
        model = _model()
        opt = _optimizer(name, model.parameters())
        _train(opt, model, x, y, 2 * HALF)
        reference[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model = _model()
        opt = _optimizer(name, model.parameters())
        _train(opt, model, x, y, HALF)
        single_state[name] = opt
        _save(tmp_path / f"one_{name}", model, opt)

    ranks = run_ranks(_worker, tmp_path, WORLD, TIMEOUT, "checkpoint resharding")

    for name in NAMES:
        ref = reference[name]
        # 1 → 2: the loaded state is the single process's, cut as each rank steps
        for rank, out in enumerate(ranks):
            got = out[name]
            _check_cut(name, rank, got["loaded"], _leaves(single_state[name]))
            for k in ref:
                torch.testing.assert_close(got["resumed"][k], ref[k], rtol=0, atol=1e-12, msg=f"1→2 {name}: {k}")
            assert geoarray.Stiefel(64, 8).is_point(got["resumed"]["W"]), name
            assert geoarray.Stiefel(16, 4).is_point(got["resumed"]["F"]), name
        # 2 → 1
        model = _model()
        opt = _optimizer(name, model.parameters())
        _load(tmp_path / f"two_{name}", model, opt)
        for rank, out in enumerate(ranks):
            _check_cut(name, rank, out[name]["saved"], _leaves(opt))
        _train(opt, model, x, y, HALF)
        for k, v in model.state_dict().items():
            torch.testing.assert_close(v, ref[k], rtol=0, atol=1e-12, msg=f"2→1 {name}: {k}")
        assert geoarray.Stiefel(64, 8).is_point(model.W.detach()), name


def _check_cut(name: str, rank: int, local: list, whole: list) -> None:
    """``local`` (a rank's cohort state tensors) is ``whole`` (the one-process state) cut as the rank
    steps: frames 4r…4r+3 of a tensor with the stack's 8 leading frames, rows 4r…4r+3 of the plain
    matrix's state under Adam, the whole of an owned matrix's state (an empty batch on the other rank),
    everything under a core of one's own — bit for bit."""
    import torch

    assert len(local) == len(whole), f"{name}: {len(local)} state tensors on rank {rank}, {len(whole)} in one process"
    for k, (a, b) in enumerate(zip(local, whole, strict=True)):
        if a.shape == b.shape:
            expected = b
        elif a.shape[:1] == (0,) and a.shape[1:] == b.shape:
            expected = b.new_empty(a.shape)  # the other rank owns it
        elif a.shape[1:] == b.shape[1:] and a.shape[0] * WORLD == b.shape[0]:
            expected = b[rank * a.shape[0] : (rank + 1) * a.shape[0]]
        else:
            raise AssertionError(f"{name}: state tensor {k} is {tuple(a.shape)} on rank {rank}, {tuple(b.shape)} whole")
        assert torch.equal(a, expected), f"{name}: state tensor {k} {tuple(a.shape)} differs on rank {rank}"


def test_checkpoint_of_another_optimizer_or_model_is_refused_and_changes_nothing():
    """(``dcp.load`` itself refuses a template with keys the checkpoint lacks; these are the dicts it
    would fill.)"""
    import torch

    from geoarray.torch.checkpoint import get_optimizer_state_dict, set_optimizer_state_dict

    model = _model()
    x, y = _batch()
    adam = _optimizer("Adam", model.parameters())
    _train(adam, model, x, y, 1)
    saved = get_optimizer_state_dict(model, adam)
    for other, match in (
        (_optimizer("SGD", model.parameters()), "another optimizer"),
        (_optimizer("Adam", [model.F, model.W]), "param group 0 holds"),
    ):
        groups = [dict(g) for g in other.param_groups]
        with pytest.raises(ValueError, match=match):
            set_optimizer_state_dict(model, other, saved)
        assert other._cohorts == [[]] and other.param_groups == groups, "a refused load changed the optimizer"
    # a state this optimizer does not hold (Adam's moments where ManifoldMuon keeps buffers), same keys otherwise
    muon = _optimizer("ManifoldMuon", model.parameters())
    _train(muon, model, x, y, 1)
    before, groups = _leaves(muon), [dict(g) for g in muon.param_groups]
    state = get_optimizer_state_dict(model, muon)
    state["state"]["F"] = saved["state"]["F"]
    with pytest.raises(ValueError, match="no state"):
        set_optimizer_state_dict(model, muon, state)
    assert all(torch.equal(a, b) for a, b in zip(_leaves(muon), before, strict=True))
    assert muon.param_groups == groups

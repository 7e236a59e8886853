"""The fixed problem behind tests/data/torch_state_v1.pt: ``opt.state_dict()`` of every named geoarray.torch
optimizer after two steps, and the weights after two more, as geoarray.torch wrote and computed them before
its optimizers became one class with recipes (geoarray commit 075a7f9, the five-level class chain).
tests/test_torch_state_reference.py loads each state_dict into today's optimizer of the same name and checks
that the next two steps give those weights (float64, to 1e-12): a checkpoint written then resumes now.

    PYTHONPATH=<a checkout of 075a7f9>/src python tests/_torch_state_reference.py   # regenerates the file
"""

from __future__ import annotations

from pathlib import Path

PATH = Path(__file__).with_name("data") / "torch_state_v1.pt"
NAMES = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "PaperAdam", "Momentum",
         "Gradient", "ManifoldMuon")  # fmt: skip
#: keywords beyond lr that make each optimizer keep the state it has (moments, momentum buffers, …)
OPTIONS = {"SGD": {"momentum": 0.9}, "RMSprop": {"momentum": 0.5, "centered": True}, "Adam": {"amsgrad": True}}


def problem(gt, geoarray, name):
    """A Stiefel(8, 3) weight and a plain 8×3 matrix, float64, in one param group, and 4 fixed gradients each."""
    import torch  # here, not at the top: the other sessions import this module without torch

    M = geoarray.Stiefel(8, 3)
    W = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64), M)
    b = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 24, dtype=torch.float64).reshape(8, 3))
    opt = getattr(gt, name)([W, b], lr=1e-2, **OPTIONS.get(name, {}))
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    grads = [(torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randn(8, 3, generator=g, dtype=torch.float64))
             for _ in range(4)]  # fmt: skip
    return W, b, opt, grads


def step(W, b, opt, grads, t):
    W.grad, b.grad = grads[t]
    opt.step()


def write() -> None:
    import torch

    import geoarray
    import geoarray.torch as gt

    out = {}
    for name in NAMES:
        W, b, opt, grads = problem(gt, geoarray, name)
        for t in range(2):
            step(W, b, opt, grads, t)
        saved = {"state_dict": opt.state_dict(), "W": W.detach().clone(), "b": b.detach().clone()}
        for t in range(2, 4):
            step(W, b, opt, grads, t)
        out[name] = {**saved, "W_after": W.detach().clone(), "b_after": b.detach().clone()}
    PATH.parent.mkdir(exist_ok=True)
    torch.save(out, PATH)


if __name__ == "__main__":
    write()

"""
A PyTorch training loop: an orthogonal RNN on the copying problem
=================================================================

geoarray in an ordinary PyTorch loop: a recurrent network whose recurrent weight :math:`W` is
orthogonal, :math:`W^\\top W = I`, so that the gradient through :math:`L` steps of the recurrence — a
product of :math:`L` Jacobians containing :math:`W` — neither explodes nor vanishes through :math:`W`. The
weight is a :class:`geoarray.torch.ManifoldParameter` on :math:`\\mathrm{St}(n, n) = O(n)`, and
:class:`geoarray.torch.Adam` — a drop-in ``torch.optim`` optimizer — trains it with the manifold Adam of
Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers* (Algorithm 1), and the
other parameters with ordinary Adam.

The task is the copying problem (Arjovsky, Shah & Bengio, *Unitary Evolution Recurrent Neural
Networks*; geotorch's example): read :math:`K = 10` symbols, then :math:`L` blanks and a marker, then
reproduce the :math:`K` symbols. A network that remembers nothing scores the *memoryless baseline*
:math:`K \\log 8 / (L + 2K)`. The page needs ``torch`` (``pip install 'geoarray-ml[torch]'``).
"""

import math
import os

import matplotlib.pyplot as plt
import torch
from torch import nn

import geoarray as ga
import geoarray.torch as gt

SMOKE = os.environ.get("GEOARRAY_GALLERY_SMOKE") == "1"  # the tests run every page at a tiny size
torch.manual_seed(0)

# %%
# The data
# --------
# Symbols 1–8, the blank 0, the marker 9. Inputs and targets have length :math:`L + 2K`.

K, ALPHABET, L = 10, 8, 5 if SMOKE else 20


def copy_batch(batch):
    symbols = torch.randint(1, ALPHABET + 1, (batch, K))
    x = torch.cat([symbols, torch.zeros(batch, L, dtype=torch.long), torch.full((batch, 1), ALPHABET + 1),
                   torch.zeros(batch, K - 1, dtype=torch.long)], dim=1)  # fmt: skip
    y = torch.cat([torch.zeros(batch, L + K, dtype=torch.long), symbols], dim=1)
    return x, y


baseline = K * math.log(ALPHABET) / (L + 2 * K)
print(f"memoryless baseline: {baseline:.4f}")

# %%
# The model
# ---------
# :math:`h_t = \mathrm{modReLU}(W h_{t-1} + V x_t + b)`, logits :math:`A h_t + c`, with
# :math:`\mathrm{modReLU}(z) = \mathrm{sign}(z)\,\mathrm{relu}(|z| + \beta)` (Arjovsky et al.). The
# recurrent weight is created as a ``ManifoldParameter`` on ``geoarray.Stiefel(n, n)``, starting from a
# random rotation (the exponential of a block-diagonal skew matrix, as in Henaff, Szlam & LeCun,
# *Recurrent Orthogonal Networks and Long-Memory Tasks*). With ``orthogonal=False`` it is a plain
# ``nn.Parameter`` with the same initial value.


def rotation(n):
    angles = (torch.rand(n // 2, dtype=torch.float64) * 2 - 1) * math.pi
    A = torch.zeros(n, n, dtype=torch.float64)
    i = torch.arange(0, n - 1, 2)
    A[i, i + 1], A[i + 1, i] = angles, -angles
    return torch.linalg.matrix_exp(A).float()


class OrthogonalRNN(nn.Module):
    def __init__(self, hidden, W0, orthogonal):
        super().__init__()
        if orthogonal:
            self.W = gt.ManifoldParameter(W0.clone(), ga.Stiefel(hidden, hidden))
        else:
            self.W = nn.Parameter(W0.clone())
        self.inputs = nn.Linear(ALPHABET + 2, hidden)
        self.beta = nn.Parameter(torch.zeros(hidden))
        self.readout = nn.Linear(hidden, ALPHABET + 1)

    def forward(self, x):
        driven = self.inputs(nn.functional.one_hot(x, ALPHABET + 2).float())
        h, states = driven.new_zeros(x.shape[0], self.W.shape[0]), []
        for t in range(x.shape[1]):
            z = driven[:, t] + h @ self.W.T
            h = torch.sign(z) * torch.relu(z.abs() + self.beta)
            states.append(h)
        return self.readout(torch.stack(states, dim=1))


# %%
# The training loop
# -----------------
# The loop is PyTorch's own: ``zero_grad``, ``backward``, ``step``. The only geoarray line is the
# optimizer. :class:`geoarray.torch.Adam` takes parameter groups like ``torch.optim.Adam``: the
# recurrent weight gets a smaller rate (geotorch's choice), and on a plain tensor the update is
# ``torch.optim.Adam``'s.

hidden, iterations = 32, 20 if SMOKE else 400
W0 = rotation(hidden)
initial = OrthogonalRNN(hidden, W0, orthogonal=False).state_dict()


def train(orthogonal):
    torch.manual_seed(1)  # the same batches for both runs
    model = OrthogonalRNN(hidden, W0, orthogonal)
    model.load_state_dict(initial)  # the same initial weights
    groups = [{"params": [model.W], "lr": 2e-4}, {"params": [p for p in model.parameters() if p is not model.W]}]
    optimizer = gt.Adam(groups, lr=1e-3) if orthogonal else torch.optim.Adam(groups, lr=1e-3)
    losses = []
    for _ in range(iterations):
        x, y = copy_batch(32)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


runs = {"orthogonal W, geoarray.torch.Adam": train(True), "unconstrained W, torch.optim.Adam": train(False)}
for name, (model, losses) in runs.items():
    W = model.W.detach()
    error = (W.T @ W - torch.eye(hidden)).abs().max().item()
    print(f"{name:>34}: mean loss of the last 50 steps {sum(losses[-50:]) / len(losses[-50:]):.4f}, "
          f"max |WᵀW − I| = {error:.1e}")  # fmt: skip

# %%
# The ``ManifoldParameter`` stays orthogonal to float32 rounding after every step; the plain one
# drifts away from the orthogonal group. ``geoarray.torch.orthogonal_(module)`` does the same conversion
# for the weight of an existing module (``nn.Linear``, ``nn.RNN``). The loss per step against the
# memoryless baseline:

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, (_, losses) in runs.items():
    ax.plot(losses, lw=1, label=name)
ax.axhline(baseline, color="gray", ls="--", lw=1, label="memoryless baseline")
ax.set(xlabel="iteration", ylabel="cross-entropy", title=f"copying problem, L = {L}", ylim=(0, 2 * baseline))
ax.legend(fontsize=8)
fig.tight_layout()

# %%
# At :math:`L = 20` both networks learn the task; the orthogonal one's advantage shows at long
# sequences, where the unconstrained recurrence's gradients vanish or explode: :doc:`/results` has the
# comparison at :math:`L = 300` over 8 seeds (``python examples/copying_problem.py``).

"""
The gauge count of GPT-2: the paper's formula and the exact number
==================================================================

van Nierop (*Transformer models are gauge invariant*) counts the redundant parameters of a transformer
stack as 2·n_t·n_h·d_h² + (d_e−1)(d_e−2)/2 (eq. 17). ``geoarray.gauge.redundancy`` gives the exact count
(the number of independent continuous symmetries at generic weights, checked against the nullity of the
Jacobian on small configurations); ``geoarray gauge table`` prints the comparison of :doc:`/gauge`.
This page computes both for four architectures, then checks on a tiny GPT-2 that a random gauge element
leaves the log-probabilities unchanged and that the exact count equals the Jacobian's nullity.
"""

import os

import matplotlib.pyplot as plt
import numpy as np

import geoarray as ga

SMOKE = os.environ.get("GEOARRAY_GALLERY_SMOKE") == "1"  # the tests run every page at a tiny size

configs = {
    "gpt2": (12, 12, 64, 768),
    "gpt2-XL": (48, 25, 64, 1600),
    "LLaMA-65B": (80, 64, 128, 8192),
    "all-MiniLM-L6-v2": (6, 12, 32, 384),
}
names = {"gpt2": "gpt2", "gpt2-XL": "gpt2-xl", "LLaMA-65B": "llama-65b", "all-MiniLM-L6-v2": "all-minilm-l6-v2"}
paper = {k: ga.gauge.paper_redundancy(*v) for k, v in configs.items()}
exact = {k: ga.gauge.redundancy(names[k]).total for k in configs}
for k in configs:
    print(f"{k:>18}: eq. 17 {paper[k]:>12,}   exact {exact[k]:>12,}")

# %%
# :func:`geoarray.gauge.paper_redundancy` takes (layers :math:`n_t`, heads :math:`n_h`, head dimension
# :math:`d_h`, model dimension :math:`d_e`) and evaluates eq. 17; :func:`geoarray.gauge.redundancy` takes a
# configuration (a preset name or a dict) and returns the exact count with its ``breakdown`` by source.
# They differ where the architecture has other symmetries than eq. 17 assumes: GPT-2's tied embeddings
# break the residual-stream rotation the formula counts, while its norms, biases and embeddings add
# directions the formula misses; LLaMA's rotary embeddings leave only :math:`d_h` of the
# :math:`d_h^2` query/key directions per head.

print({source: count for source, count in ga.gauge.redundancy("gpt2").breakdown.items() if count})
#
# The two counts side by side (log scale):

fig, ax = plt.subplots(figsize=(7, 3.5))
pos = np.arange(len(configs))
ax.bar(pos - 0.2, list(paper.values()), 0.4, label="eq. 17 (the paper)")
ax.bar(pos + 0.2, list(exact.values()), 0.4, label="exact count")
ax.set_xticks(pos, list(configs))
ax.set_yscale("log")
ax.set_ylabel("redundant parameters")
ax.legend()
fig.tight_layout()

# %%
# On a tiny GPT-2 the invariance and the count are checked numerically: a random gauge element changes
# the next-token log-probabilities only by rounding, and the nullity of the Jacobian with respect to all
# parameters equals the exact count.

tiny = {"arch": "gpt2", "n_layers": 1 if SMOKE else 2, "n_heads": 2, "d_head": 2, "d_model": 5, "d_ff": 4}
tiny |= {"vocab": 8, "n_ctx": 4}
gpt = ga.models.TransformerLM(tiny)
params = gpt.init(0, xp=np)
tokens = np.asarray([[1, 5, 2, 7], [3, 3, 0, 6]])
logp = gpt.apply(params, tokens)
moved, moved_params = ga.gauge.apply_gauge(gpt, params, ga.gauge.random_gauge(gpt, 1, xp=np))
print("max |Δ log p| after a random gauge element:", float(np.max(np.abs(moved.apply(moved_params, tokens) - logp))))
referee_tokens, _ = ga.gauge.referee_inputs(tiny, 0, xp=np)
print(
    "exact count",
    ga.gauge.redundancy(tiny).total,
    "= Jacobian nullity",
    ga.gauge.numerical_redundancy(gpt, params, referee_tokens).nullity,
)

"""The gauge group of transformer stacks: transform, verify, count and remove redundant parameters.

After van Nierop, "Transformer models are gauge invariant": the outputs of a transformer stack do not
change when its weights move along the orbits of a group (rotations of the residual stream, GL(d_h)
per attention head, …), so those directions are redundant parameters.

* :func:`paper_redundancy` — eq. 17 of the paper; :func:`redundancy` — the exact count with a
  breakdown by source; :func:`numerical_redundancy` — the Jacobian-nullity referee
  (:mod:`geoarray.gauge.counting` explains every source and where eq. 17 is off);
* :func:`random_gauge`, :func:`apply_gauge`, :func:`fold_norms`, :func:`untie` — the group action
  (:mod:`geoarray.gauge.transforms`);
* :func:`check` — apply a random element to a config or checkpoint and report output and weight changes;
* :func:`gauge_fix` / :class:`GaugeFixedLM` — a canonical form storing only non-redundant
  parameters (:mod:`geoarray.gauge.fixing`); :func:`save_fixed` / :func:`load_fixed`.

The models are :class:`geoarray.models.TransformerLM` (GPT-2, LLaMA and BERT styles).
"""

from .check import check, load_model
from .checkpoints import load_fixed, save_fixed
from .counting import (
    NumericalRedundancy,
    Redundancy,
    numerical_redundancy,
    paper_redundancy,
    redundancy,
    referee_inputs,
)
from .fixing import GaugeFixedLM, canonicalize, gauge_fix
from .transforms import (
    GaugeElement,
    apply_gauge,
    fold_norms,
    haar_orthogonal,
    haar_rotation_fixing_ones,
    random_gauge,
    random_gl,
    untie,
)

__all__ = [
    "GaugeElement",
    "GaugeFixedLM",
    "NumericalRedundancy",
    "Redundancy",
    "apply_gauge",
    "canonicalize",
    "check",
    "fold_norms",
    "gauge_fix",
    "haar_orthogonal",
    "haar_rotation_fixing_ones",
    "load_fixed",
    "load_model",
    "numerical_redundancy",
    "paper_redundancy",
    "random_gauge",
    "random_gl",
    "redundancy",
    "referee_inputs",
    "save_fixed",
    "untie",
]

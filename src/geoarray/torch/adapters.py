r"""Orthogonal fine-tuning of pretrained models: block-diagonal orthogonal adapters trained on the group.

In use::

    import geoarray.torch as gt
    from geoarray.torch import adapters

    model = adapters.orthogonal(model, ["query", "value"], block_size=16)   # base frozen, every R = I
    opt = gt.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)   # R stays in O(16)
    ...                                                                       # train as usual
    safetensors.torch.save_file(adapters.adapter_state_dict(model), "adapter.safetensors")  # only the R's
    model = adapters.merge(model)                  # a plain model: its state_dict keys are the base's

**The adapter** (orthogonal fine-tuning, OFT: Qiu et al., *Controlling Text-to-Image Diffusion by
Orthogonal Finetuning*, NeurIPS 2023; block-diagonal R as in PEFT's OFT and in Liu et al.,
*Parameter-Efficient Orthogonal Finetuning via Butterfly Factorization* (BOFT), ICLR 2024). Write a
linear layer as y = x A + b with A ∈ ℝ^{d_in × d_out} its fan-in × fan-out matrix (``nn.Linear``
stores W = Aᵀ, transformers' GPT-2 ``Conv1D`` stores A itself). The adapter is

.. math::

    B = \operatorname{blockdiag}(R_1, \dots, R_k), \qquad R_i \in O(b), \quad k\,b = d,

with d = d_in for ``side="input"`` and d = d_out for ``side="output"``:

* ``side="input"`` (OFT, PEFT's only side): y = (x B) A + b, i.e. A' = B A — for ``nn.Linear``
  W' = W Bᵀ. Every neuron (row of W) is rotated by the same B, so the angles between neurons, the
  "hyperspherical energy" OFT preserves, are unchanged;
* ``side="output"``: y = (x A + b) B, i.e. A' = A B and b' = b B — for ``nn.Linear`` W' = Bᵀ W. The
  bias turns with the output, so the adapted layer is again a linear layer and merging is exact.

R is one :class:`~geoarray.torch.ManifoldParameter` of shape (k, b, b) on ``Stiefel(b, b)``, which is
the orthogonal group O(b): geoarray's optimizers (:class:`~geoarray.torch.Adam`,
:class:`~geoarray.torch.ManifoldMuon`, …, with every ``torch.optim.lr_scheduler``) step all k blocks in
one batched call and keep each exactly orthogonal (RᵀR = I to the dtype's rounding) by a retraction,
with no parametrisation in the forward pass. PEFT's OFT instead trains a skew matrix Q and forms R from
it in every forward: R = (I − Q)(I + Q)⁻¹ (exact Cayley, a b×b solve per block) or a truncated
Neumann series (its default), which is not orthogonal once Q is not small. Every R starts at the
identity, so the adapted model computes what the base model computes (to rounding: the products with
I are exact, only the reshapes differ).

The forward pass never forms B: x is viewed as (…, k, b) and multiplied block by block (one batched
product, k·b² multiply-adds per row instead of d²).

**Choices, and why.**

* ``block_size=b`` or ``n_blocks=k`` (PEFT's ``oft_block_size`` and ``r``), exactly one. Each adapted
  layer holds k·b² = d·b numbers, of which k·b(b−1)/2 are free (dim O(b) = b(b−1)/2): the trainable
  budget of PEFT's OFT with the same b. A width that ``b`` does not divide is an error naming the layer
  (PEFT silently adjusts the block size; a different adapter than the one asked for is a surprise).
* No scaling or COFT-style ε-ball constraint: a scaled rotation is not in O(b), and COFT's projection
  of Q onto a ball has no clear meaning for a point of the group trained directly (a learning rate
  schedule bounds the distance travelled instead).
* The base model is frozen entirely (every parameter except the R's), as PEFT does; name modules to
  keep trainable (a classification head) in ``trainable_modules``.
* :func:`merge` folds B into the weights in place and keeps the adapters aside (not in the
  ``state_dict``), so :func:`unmerge` can restore them: W = W'·B for the input side (B⁻¹ = Bᵀ: no
  inverse, only rounding).

**PEFT.** :func:`to_peft_state_dict` / :func:`peft_config` write an adapter in PEFT OFT's format
(exact Cayley), and :func:`from_peft_state_dict` reads one (either Cayley variant), so an adapter moves
both ways between ``peft.PeftModel`` (its hub, serving, multi-adapter switching) and geoarray's
training on the group. We chose conversion over training PEFT's own modules on the manifold: PEFT's
trainable tensor is the skew Q, not R, so "its R exactly orthogonal at every step" would mean replacing
its forward pass by ours anyway, and would tie geoarray to PEFT's internal module layout, which has
changed between releases (0.14, 0.18); a file format is the stable interface. The conversion is the
Cayley map itself, Q = (I − R)(I + R)⁻¹ (an involution: PEFT's R = (I − Q)(I + Q)⁻¹ gives back R), so
it is exact to rounding for every R without the eigenvalue −1 (every R reached continuously from I
has det R = +1; one with an eigenvalue −1 is refused, naming the layer).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import torch

from ..manifolds.stiefel import Stiefel
from .parameter import ManifoldParameter

__all__ = [
    "OrthogonalAdapter",
    "adapter_state_dict",
    "from_peft_state_dict",
    "load_adapter_state_dict",
    "merge",
    "orthogonal",
    "peft_config",
    "to_peft_state_dict",
    "unmerge",
]

# where merge() keeps the adapters it folded in (an attribute of the root module, not a submodule: the
# merged model's state_dict must hold the base's keys only)
_MERGED = "_geoarray_merged_adapters"
_SIDES = ("input", "output")
# the keys PEFT gives an OFT block: get_peft_model_state_dict drops the adapter name ("oft_R.weight"),
# a live PeftModel's state_dict has it ("oft_R.default.weight")
_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<name>.+)\.oft_R(?:\.(?P<adapter>[^.]+))?\.weight$")


def _is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's linear layer, weight stored as (in, out)), recognised by class
    name and home module, so this file works without transformers installed."""
    return any(
        cls.__name__ == "Conv1D" and cls.__module__.split(".")[0] == "transformers" for cls in type(module).__mro__
    )


def _fan_in_out(module: torch.nn.Module) -> tuple[int, int] | None:
    """(d_in, d_out) of a supported linear layer, None for anything else (a quantized or odd weight too)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        return None
    if _is_conv1d(module):
        return int(weight.shape[0]), int(weight.shape[1])
    if isinstance(module, torch.nn.Linear):
        # a packed (quantized) weight does not have the logical shape; such layers are not supported
        if tuple(weight.shape) != (module.out_features, module.in_features):
            return None
        return module.in_features, module.out_features
    return None


def _weight(module: torch.nn.Module) -> torch.Tensor:
    return cast(torch.Tensor, module.weight)


def _bias(module: torch.nn.Module) -> torch.Tensor | None:
    bias = getattr(module, "bias", None)
    return bias if isinstance(bias, torch.Tensor) else None


def _rotate(x: torch.Tensor, R: torch.Tensor, *, transpose: bool = False) -> torch.Tensor:
    """x · blockdiag(R₁, …, R_k) (or · blockdiag(R)ᵀ) along the last axis, without forming the d×d matrix:
    x is viewed as (…, k, b) and each block multiplied by its R_i, one batched product."""
    k, b, _ = R.shape
    if R.dtype != x.dtype:  # autocast or a half-precision activation: compute in the activation's dtype
        R = R.to(x.dtype)
    if k == 1:
        return x @ (R[0].mT if transpose else R[0])
    blocks = x.reshape(*x.shape[:-1], k, b)
    out = torch.einsum("...kc,kbc->...kb" if transpose else "...kb,kbc->...kc", blocks, R)
    return out.reshape(x.shape)


class OrthogonalAdapter(torch.nn.Module):
    r"""A linear layer (``nn.Linear`` or transformers' ``Conv1D``) with a block-diagonal orthogonal adapter.

    ``forward(x) = base_layer(x · B)`` for ``side="input"`` and ``base_layer(x) · B`` for ``side="output"``,
    B = blockdiag(R₁, …, R_k) with ``R`` a :class:`~geoarray.torch.ManifoldParameter` of shape (k, b, b)
    on ``Stiefel(b, b)`` = O(b), starting at the identity (module docstring for the math). Made by
    :func:`orthogonal`; ``base_layer`` is the original module, unchanged (its weights frozen there).
    ``weight`` and ``bias`` read through to the base layer's, for code that inspects a layer's weight
    (its dtype or device).
    """

    R: ManifoldParameter

    def __init__(self, base_layer: torch.nn.Module, block_size: int, side: str = "input") -> None:
        super().__init__()
        dims = _fan_in_out(base_layer)
        if dims is None:
            kind = type(base_layer).__name__
            raise TypeError(f"OrthogonalAdapter: {kind} is not an nn.Linear or a transformers Conv1D")
        if side not in _SIDES:
            raise ValueError(f"OrthogonalAdapter: side must be 'input' or 'output', got {side!r}")
        width = dims[0] if side == "input" else dims[1]
        if block_size < 2 or width % block_size:
            raise ValueError(f"OrthogonalAdapter: block_size {block_size} does not divide the {side} width {width}")
        self.base_layer = base_layer
        self.side = side
        self.block_size = block_size
        self.n_blocks = width // block_size
        self.transposed = _is_conv1d(base_layer)  # weight stored as A (in, out) rather than W = Aᵀ
        w = _weight(base_layer)
        eye = torch.eye(block_size, dtype=w.dtype, device=w.device).expand(self.n_blocks, block_size, block_size)
        # the identity is a point of O(b) exactly: check=False spares the membership test's host read
        self.R = ManifoldParameter(eye.clone(), Stiefel(block_size, block_size), check=False)

    @property
    def weight(self) -> torch.Tensor:
        """The base layer's (unadapted) weight."""
        return _weight(self.base_layer)

    @property
    def bias(self) -> torch.Tensor | None:
        """The base layer's bias (None without one)."""
        return _bias(self.base_layer)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``base_layer(x · B)`` (input side) or ``base_layer(x) · B`` (output side)."""
        if self.side == "input":
            return self.base_layer(_rotate(x, self.R), *args, **kwargs)
        return _rotate(self.base_layer(x, *args, **kwargs), self.R)

    def extra_repr(self) -> str:
        return f"side={self.side!r}, block_size={self.block_size}, n_blocks={self.n_blocks}"

    @torch.no_grad()
    def _fold(self, *, undo: bool) -> None:
        """Write the adapted weights A' = B A (input) or A' = A B, b' = b B (output) into the base layer;
        ``undo`` writes back A = Bᵀ A' (or A' Bᵀ, b' Bᵀ). Computed in float32 at least, then cast."""
        base = self.base_layer
        w, bias = _weight(base), _bias(base)
        work = w.dtype if w.dtype in (torch.float32, torch.float64) else torch.float32
        R = self.R.detach().to(device=w.device, dtype=work)
        A = (w if self.transposed else w.mT).to(work)  # the fan-in × fan-out matrix
        if self.side == "input":
            # B A = (Aᵀ Bᵀ)ᵀ; its inverse Bᵀ A' = (A'ᵀ B)ᵀ
            new = _rotate(A.mT, R, transpose=not undo).mT
        else:
            new = _rotate(A, R, transpose=undo)
            if bias is not None:
                bias.copy_(_rotate(bias.to(work), R, transpose=undo).to(bias.dtype))
        w.copy_((new if self.transposed else new.mT).to(w.dtype))


def _matcher(target_modules: Any) -> Callable[[str, torch.nn.Module], bool]:
    """PEFT's ``target_modules`` rules: a list of names, each matching the full qualified name or its end
    after a dot; a string, a regular expression the full name must match; a callable (name, module) → bool."""
    if callable(target_modules):
        return lambda name, module: bool(target_modules(name, module))
    if isinstance(target_modules, str):
        try:
            pattern = re.compile(target_modules)
        except re.error as exc:
            raise ValueError(
                f"orthogonal: target_modules {target_modules!r} is not a regular expression ({exc})"
            ) from None
        return lambda name, module: pattern.fullmatch(name) is not None
    if isinstance(target_modules, Iterable):
        keys = list(target_modules)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise TypeError(
                f"orthogonal: target_modules must be a non-empty list of module names, a regex or a callable, "
                f"got {target_modules!r}"
            )
        return lambda name, module: any(name == k or name.endswith("." + k) for k in keys)
    raise TypeError(
        f"orthogonal: target_modules must be a list of module names, a regex string or a callable, "
        f"got {type(target_modules).__name__}"
    )


def _adapters(model: torch.nn.Module) -> dict[str, OrthogonalAdapter]:
    return {name: m for name, m in model.named_modules() if isinstance(m, OrthogonalAdapter)}


def _set_submodule(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)


def orthogonal(
    model: torch.nn.Module,
    target_modules: Iterable[str] | str | Callable[[str, torch.nn.Module], bool],
    *,
    block_size: int | None = None,
    n_blocks: int | None = None,
    side: str = "input",
    trainable_modules: Iterable[str] = (),
) -> torch.nn.Module:
    r"""Put a block-diagonal orthogonal adapter on every linear layer of ``model`` that ``target_modules``
    names; freeze the rest of the model; return ``model`` (changed in place, as ``peft.get_peft_model``).

    Each matching ``nn.Linear`` (or transformers ``Conv1D``) is replaced by an :class:`OrthogonalAdapter`
    computing ``base_layer(x · B)`` (``side="input"``; W' = W Bᵀ) or ``base_layer(x) · B``
    (``side="output"``; W' = Bᵀ W, b' = Bᵀ b), B = blockdiag(R₁, …, R_k), R_i ∈ O(b), R a
    :class:`~geoarray.torch.ManifoldParameter` (k, b, b) on ``Stiefel(b, b)`` starting at the identity,
    so the model's output is unchanged. Train the R's with a geoarray optimizer
    (``gt.Adam([p for p in model.parameters() if p.requires_grad], lr=...)``), which keeps them orthogonal.

    ``target_modules`` follows PEFT: a list of names, each matching a module's full qualified name or
    its last components (``"query"`` matches ``"bert.encoder.layer.0.attention.self.query"``); a string,
    a regular expression the full name must match; or a callable ``(name, module) → bool``. The model
    itself (name ``""``) is never a target. ``block_size`` (b, PEFT's ``oft_block_size``) or
    ``n_blocks`` (k, PEFT's ``r``): exactly one; b must divide the width of every target (the input
    width for ``side="input"``, the output width for ``"output"``) and be at least 2 (O(1) = {±1} has
    nothing to train). ``trainable_modules``: names (same rules as a list of ``target_modules``) of
    modules whose parameters stay trainable, e.g. ``["classifier"]``; every other parameter of the
    model gets ``requires_grad=False``.

    Every target is checked before anything changes: a ``ValueError``/``TypeError`` naming the module,
    the argument and the fix leaves the model as it was.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"orthogonal: model must be a torch.nn.Module, got {type(model).__name__}")
    if (block_size is None) == (n_blocks is None):
        raise ValueError(
            f"orthogonal: give exactly one of block_size and n_blocks (got block_size={block_size!r}, "
            f"n_blocks={n_blocks!r}); e.g. block_size=16"
        )
    for arg, value in (("block_size", block_size), ("n_blocks", n_blocks)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"orthogonal: {arg} must be a positive int, got {value!r}")
    if side not in _SIDES:
        raise ValueError(f"orthogonal: side must be 'input' or 'output', got {side!r}")
    match = _matcher(target_modules)
    keep = _matcher(list(trainable_modules)) if list(trainable_modules) else (lambda name, module: False)
    # the layers inside existing adapters are not targets (their adapter is, and is refused below)
    inside = {f"{n}.{sub}" for n, a in _adapters(model).items() for sub, _ in a.named_modules() if sub}
    plan: list[tuple[str, torch.nn.Module, int]] = []
    for name, module in model.named_modules():
        if not name or name in inside or not match(name, module):
            continue
        if isinstance(module, OrthogonalAdapter):
            raise ValueError(
                f"orthogonal: {name!r} already has an orthogonal adapter; merge(model) or load the base model "
                "before adding another"
            )
        dims = _fan_in_out(module)
        if dims is None:
            raise TypeError(
                f"orthogonal: target_modules matches {name!r}, a {type(module).__name__}, which is not an "
                "nn.Linear or a transformers Conv1D; name its linear layers instead (e.g. "
                f"{name + '.<linear>'!r}) or narrow target_modules"
            )
        width = dims[0] if side == "input" else dims[1]
        b = block_size if block_size is not None else (width // n_blocks if n_blocks and width % n_blocks == 0 else 0)
        if not b or width % b:
            given = f"block_size={block_size}" if block_size is not None else f"n_blocks={n_blocks}"
            divisors = [d for d in range(2, width + 1) if width % d == 0][:8]
            raise ValueError(
                f"orthogonal: {name!r} has {side} width {width}, which {given} does not divide; choose a "
                f"block size among the divisors {divisors}… (or exclude this layer from target_modules)"
            )
        if b < 2:
            raise ValueError(
                f"orthogonal: {name!r} gets blocks of size {b} (width {width}, n_blocks={n_blocks}): O(1) = "
                "{±1} has nothing to train; use fewer blocks"
            )
        plan.append((name, module, b))
    if not plan:
        raise ValueError(
            f"orthogonal: target_modules={target_modules!r} matches no module of {type(model).__name__}; "
            "list the linear layers' names (model.named_modules()), e.g. ['query', 'value'] for BERT, "
            "['c_attn'] for GPT-2"
        )
    adapters = [(name, OrthogonalAdapter(module, b, side)) for name, module, b in plan]
    # freeze the base model (every parameter but the new R's), then put the adapters in place
    for param in model.parameters():
        param.requires_grad_(False)
    for name, module in model.named_modules():
        if name and keep(name, module):
            for param in module.parameters():
                param.requires_grad_(True)
    for name, adapter in adapters:
        _set_submodule(model, name, adapter)
    return model


def merge(model: torch.nn.Module) -> torch.nn.Module:
    r"""Fold every adapter into its layer's weight and return ``model`` as a plain model, in place.

    Each :class:`OrthogonalAdapter` is replaced by its base layer with the adapted weights: W' = W Bᵀ
    (``nn.Linear``, input side; A' = B A for a ``Conv1D``'s A = Wᵀ) or W' = Bᵀ W, b' = Bᵀ b (output
    side), computed in float32 at least. The model's ``state_dict`` keys are then the base model's, so
    ``save_pretrained`` writes a checkpoint that the original class's ``from_pretrained`` loads. The
    outputs equal the adapted model's to rounding. The adapters are kept aside, outside the
    ``state_dict``, for :func:`unmerge`. Trainability flags are left as :func:`orthogonal` set them.
    ``ValueError`` when there is nothing to merge (no adapters, or merged already).
    """
    found = _adapters(model)
    if not found:
        if getattr(model, _MERGED, None):
            raise ValueError("merge: this model's adapters are merged already; unmerge(model) takes them out again")
        raise ValueError(f"merge: {type(model).__name__} has no orthogonal adapters; add them with orthogonal(...)")
    if isinstance(model, OrthogonalAdapter):
        raise ValueError("merge: model is itself an OrthogonalAdapter; merge the model that contains it")
    for name, adapter in found.items():
        adapter._fold(undo=False)
        _set_submodule(model, name, adapter.base_layer)
    model.__dict__[_MERGED] = found
    return model


def unmerge(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`merge`: put the adapters back and restore the base weights, W = W'·B (input side; B⁻¹ =
    Bᵀ, so this is exact up to rounding). Returns ``model``. ``ValueError`` for a model that
    :func:`merge` did not merge (a checkpoint loaded with ``from_pretrained`` holds no adapters: build
    them with :func:`orthogonal` and :func:`load_adapter_state_dict` on the base model instead)."""
    kept: dict[str, OrthogonalAdapter] | None = model.__dict__.get(_MERGED)
    if not kept:
        raise ValueError(
            f"unmerge: {type(model).__name__} holds no adapters merged by merge(model) (a model loaded from a merged "
            "checkpoint has none); load the base model, orthogonal(...) and load_adapter_state_dict(...) instead"
        )
    for name, adapter in kept.items():  # check every layer before changing any
        current = model.get_submodule(name)
        if current is not adapter.base_layer:
            raise ValueError(
                f"unmerge: {name!r} is no longer the layer merge(model) folded the adapter into "
                f"({type(current).__name__}); it cannot be unmerged"
            )
    for name, adapter in kept.items():
        adapter._fold(undo=True)
        _set_submodule(model, name, adapter)
    del model.__dict__[_MERGED]
    return model


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapters' blocks: ``{"<layer name>.R": tensor (k, b, b)}``, the keys these tensors have in
    ``model.state_dict()``. Plain, contiguous, detached tensors that share storage with the parameters
    (as ``state_dict``'s: clone them for a snapshot), ready for ``safetensors.torch.save_file``.
    ``ValueError`` for a model without adapters."""
    found = _adapters(model)
    if not found:
        raise ValueError(
            f"adapter_state_dict: {type(model).__name__} has no orthogonal adapters"
            + (" (they are merged: unmerge(model) first)" if getattr(model, _MERGED, None) else "")
        )
    return {f"{name}.R": adapter.R.detach() for name, adapter in found.items()}


def load_adapter_state_dict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy the blocks of :func:`adapter_state_dict` into ``model``'s adapters (made by :func:`orthogonal`
    with the same targets and block sizes), bit for bit in the same dtype.

    Everything is checked before anything is copied: the keys must be exactly the model's adapter keys,
    every shape equal, every block orthogonal to its dtype's tolerance (``Stiefel(b, b).is_point``); a
    ``ValueError`` names the key and the fix."""
    found = _adapters(model)
    if not found:
        raise ValueError(
            f"load_adapter_state_dict: {type(model).__name__} has no orthogonal adapters; call "
            "orthogonal(model, target_modules, block_size=...) with the targets the adapters were saved from"
        )
    expected = {f"{name}.R": adapter for name, adapter in found.items()}
    missing, unexpected = sorted(set(expected) - set(state_dict)), sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"load_adapter_state_dict: keys do not match the model's adapters: missing {missing}, unexpected "
            f"{unexpected}; build the adapters with the same target_modules as when they were saved"
        )
    for key, adapter in expected.items():
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"load_adapter_state_dict: {key!r} must be a torch.Tensor, got {type(value).__name__}")
        if tuple(value.shape) != tuple(adapter.R.shape):
            raise ValueError(
                f"load_adapter_state_dict: {key!r} has shape {tuple(value.shape)}, the model's adapter "
                f"{tuple(adapter.R.shape)}; use the block_size the adapters were saved with"
            )
        manifold = adapter.R.manifold
        assert manifold is not None
        probe = value.detach().to(device=adapter.R.device, dtype=adapter.R.dtype)
        if not value.dtype.is_floating_point or not manifold.is_point(probe if probe.itemsize >= 4 else probe.float()):
            err = (probe.float().mT @ probe.float() - torch.eye(probe.shape[-1], device=probe.device)).abs().max()
            raise ValueError(
                f"load_adapter_state_dict: {key!r} is not orthogonal (max|RᵀR − I| = {float(err):.3g}); "
                "project it with geoarray.torch.nearest_point(R, geoarray.Stiefel(b, b)) if that is meant"
            )
    with torch.no_grad():
        for key, adapter in expected.items():
            adapter.R.copy_(state_dict[key])


# --------------------------------------------------------------------------------------------- PEFT


def _skew_from_upper(vec: torch.Tensor, b: int) -> torch.Tensor:
    """Q = S − Sᵀ with S strictly upper triangular holding ``vec`` row by row (PEFT's coordinates)."""
    rows, cols = torch.triu_indices(b, b, 1, device=vec.device)
    S = vec.new_zeros(*vec.shape[:-1], b, b)
    S[..., rows, cols] = vec
    return S - S.mT


def _cayley(Q: torch.Tensor) -> torch.Tensor:
    """(I − Q)(I + Q)⁻¹, orthogonal for skew Q; an involution on matrices without the eigenvalue −1."""
    eye = torch.eye(Q.shape[-1], dtype=Q.dtype, device=Q.device)
    # X (I + Q) = I − Q; I − Q and (I + Q)⁻¹ commute, so X is also (I + Q)⁻¹(I − Q)
    return torch.linalg.solve(eye + Q, eye - Q, left=False)


def _neumann(Q: torch.Tensor, terms: int) -> torch.Tensor:
    """PEFT's truncated series for (I + Q)(I − Q)⁻¹ = I + 2Q + 2Q² + …: I + 2 Σ_{j=1}^{m−2} Qʲ + Q^{m−1} with
    m = ``terms`` (m = 2: I + 2Q; m ≤ 1: I). Not orthogonal unless Q is small."""
    eye = torch.eye(Q.shape[-1], dtype=Q.dtype, device=Q.device).expand(Q.shape)
    out = eye.clone()
    if terms <= 1:
        return out
    if terms == 2:
        return out + 2 * Q
    power = eye
    for j in range(1, terms):
        power = power @ Q
        out = out + (2 if j < terms - 1 else 1) * power
    return out


def _config_field(config: Any, name: str, default: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def from_peft_state_dict(state_dict: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    r"""Convert PEFT OFT blocks to :func:`adapter_state_dict`'s format, for :func:`load_adapter_state_dict`.

    ``state_dict``: PEFT's adapter file (``adapter_model.safetensors``, keys
    ``base_model.model.<layer>.oft_R.weight``) or a live ``PeftModel``'s ``state_dict`` (keys with the
    adapter's name; entries that are not OFT blocks, such as ``modules_to_save``, are left out). ``config``:
    the ``OFTConfig`` or the dict of ``adapter_config.json``; its ``use_cayley_neumann`` and
    ``num_cayley_neumann_terms`` say how PEFT forms R from its coordinates q ∈ ℝ^{b(b−1)/2} per block
    (Q = S − Sᵀ, S strictly upper triangular holding q row by row):

    * exact Cayley (``use_cayley_neumann=False``): R = (I − Q)(I + Q)⁻¹, orthogonal; converted exactly;
    * Cayley–Neumann (PEFT's default): R̃ = I + 2Q + 2Q² + … + 2Q^{m−2} + Q^{m−1}, which is not
      orthogonal once Q is not small; it is replaced by its nearest orthogonal matrix (the polar factor,
      :func:`~geoarray.torch.nearest_point`), and a ``UserWarning`` gives max|R̃ᵀR̃ − I| when that
      exceeds the dtype's tolerance (the converted model then differs from PEFT's by that much).

    Returns ``{"<layer>.R": (k, b, b)}`` in the dtype of PEFT's tensors; build the model with
    ``orthogonal(base, target_modules, block_size=b)`` (``side="input"``: PEFT rotates inputs), then
    :func:`load_adapter_state_dict`. ``block_share`` and ``coft`` adapters are refused (no equivalent).
    """
    if _config_field(config, "block_share", False):
        raise ValueError("from_peft_state_dict: block_share=True adapters (one block for all) are not supported")
    if _config_field(config, "coft", False):
        raise ValueError("from_peft_state_dict: coft=True (constrained OFT) adapters are not supported")
    neumann = bool(_config_field(config, "use_cayley_neumann", True))
    terms = int(_config_field(config, "num_cayley_neumann_terms", 5))
    out: dict[str, torch.Tensor] = {}
    for key, vec in state_dict.items():
        found = _PEFT_KEY.match(key)
        if found is None:
            continue
        n = vec.shape[-1]
        b = (1 + math.isqrt(1 + 8 * n)) // 2
        if vec.ndim != 2 or b * (b - 1) // 2 != n:
            raise ValueError(
                f"from_peft_state_dict: {key!r} has shape {tuple(vec.shape)}; an OFT block tensor is (k, b(b−1)/2)"
            )
        Q = _skew_from_upper(vec.detach().to(torch.float64), b)
        if neumann:
            approx = _neumann(Q, terms)
            eye = torch.eye(b, dtype=torch.float64, device=Q.device)
            err = float((approx.mT @ approx - eye).abs().max())
            tol = Stiefel(b, b).default_atol(vec.dtype, _xp())
            if err > tol:
                warnings.warn(
                    f"from_peft_state_dict: PEFT's Cayley–Neumann blocks of {key!r} are not orthogonal "
                    f"(max|RᵀR − I| = {err:.3g}); replaced by the nearest orthogonal matrices",
                    UserWarning,
                    stacklevel=2,
                )
            R = Stiefel(b, b).nearest_point(approx)  # the polar factor, as geoarray projects everywhere
        else:
            R = _cayley(Q)
        out[f"{found.group('name')}.R"] = R.to(vec.dtype).contiguous()
    if not out:
        raise ValueError(
            "from_peft_state_dict: no OFT blocks (keys '<layer>.oft_R.weight') in the state dict; "
            f"its first keys are {list(state_dict)[:3]}"
        )
    return out


def _xp() -> Any:
    import array_api_compat.torch as xp

    return xp


def to_peft_state_dict(model: torch.nn.Module, *, rcond: float = 1e-4) -> dict[str, torch.Tensor]:
    r"""The adapters in PEFT OFT's file format (exact Cayley), for ``peft.set_peft_model_state_dict`` or
    ``safetensors`` as ``adapter_model.safetensors``, with :func:`peft_config` as its configuration.

    For each block, PEFT's coordinates are the strict upper triangle (row by row) of the inverse Cayley
    transform Q = (I − R)(I + R)⁻¹, so PEFT's R = (I − Q)(I + Q)⁻¹ is ours to rounding. Keys are
    ``base_model.model.<layer>.oft_R.weight``, values (k, b(b−1)/2). ``side="output"`` adapters have no
    PEFT equivalent, nor a block with an eigenvalue near −1 (smallest singular value of I + R below
    ``rcond``: Q would be unbounded); both raise ``ValueError`` naming the layer.
    """
    out: dict[str, torch.Tensor] = {}
    for name, adapter in _adapters(model).items():
        if adapter.side != "input":
            raise ValueError(f"to_peft_state_dict: {name!r} has side='output'; PEFT's OFT rotates inputs only")
        R = adapter.R.detach().to(torch.float64)
        b = adapter.block_size
        eye = torch.eye(b, dtype=torch.float64, device=R.device)
        smallest = torch.linalg.svdvals(eye + R).min(dim=-1).values
        if bool((smallest < rcond).any()):
            block = int(smallest.argmin())
            raise ValueError(
                f"to_peft_state_dict: block {block} of {name!r} has an eigenvalue at −1 (σ_min(I + R) = "
                f"{float(smallest[block]):.3g} < rcond={rcond}), outside the range of PEFT's Cayley map"
            )
        Q = torch.linalg.solve(eye + R, eye - R, left=False)  # Cayley is its own inverse
        rows, cols = torch.triu_indices(b, b, 1, device=R.device)
        out[f"base_model.model.{name}.oft_R.weight"] = Q[..., rows, cols].to(adapter.R.dtype).contiguous()
    if not out:
        raise ValueError(f"to_peft_state_dict: {type(model).__name__} has no orthogonal adapters (merged? unmerge)")
    return out


def peft_config(model: torch.nn.Module, **overrides: Any) -> Any:
    """A ``peft.OFTConfig`` describing ``model``'s adapters (targets by full name, the block size, exact
    Cayley: ``use_cayley_neumann=False``), ``overrides`` passed on (``task_type``, ``modules_to_save``, …).
    ``get_peft_model(base, peft_config(model))`` then ``set_peft_model_state_dict(peft_model,
    to_peft_state_dict(model))`` reproduces the adapted model in PEFT. Needs peft (``pip install
    'geoarray-ml[hf]'``); ``ValueError`` when the adapters' block sizes differ and so do their block
    counts (PEFT's config holds one of the two)."""
    try:
        from peft import OFTConfig
    except ModuleNotFoundError as exc:
        if exc.name != "peft":
            raise
        from .._install import install_hint

        raise ModuleNotFoundError(f"peft_config needs peft: {install_hint('hf')}", name="peft") from None
    found = _adapters(model)
    if not found:
        raise ValueError(f"peft_config: {type(model).__name__} has no orthogonal adapters (merged? unmerge first)")
    for name, adapter in found.items():
        if adapter.side != "input":
            raise ValueError(f"peft_config: {name!r} has side='output'; PEFT's OFT rotates inputs only")
    sizes = {a.block_size for a in found.values()}
    counts = {a.n_blocks for a in found.values()}
    if len(sizes) == 1:
        shape = {"oft_block_size": sizes.pop(), "r": 0}
    elif len(counts) == 1:
        shape = {"oft_block_size": 0, "r": counts.pop()}
    else:
        raise ValueError(
            f"peft_config: the adapters have block sizes {sorted(sizes)} and block counts {sorted(counts)}; "
            "PEFT's OFTConfig holds one block size or one count for all layers"
        )
    kwargs = {"target_modules": sorted(found), "use_cayley_neumann": False, **shape, **overrides}
    return OFTConfig(**kwargs)

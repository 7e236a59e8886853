"""The vision transformer of Brantner, "Generalizing Adam to manifolds for efficiently training transformers"."""

from __future__ import annotations

from typing import Any

from ..nn import Chain, ClassificationLayer, Layer, MultiHeadAttention, ResNetLayer
from ..nn._checks import check_size

__all__ = ["ClassificationTransformer"]

from .._typing import Array


class ClassificationTransformer(Layer):
    """L × [multi-head attention, feed-forward with add connection], then the classification layer.

    The architecture of the MNIST experiment in Brantner, "Generalizing Adam to manifolds for
    efficiently training transformers" (section on the vision transformer): an image cut into
    ``n_patches`` flattened patches of ``patch_dim`` pixels (:func:`geoarray.data.patches`, fig. 2) is
    a sequence x (..., n_patches, patch_dim) — the transpose of the paper's patch_dim × n_patches
    matrix. Each of the ``n_layers`` blocks applies

    * :class:`~geoarray.nn.MultiHeadAttention` (eq. 14) with ``n_heads`` heads,
      A(x) = [V_i softmax(Q_iᵀK_i)]_i, followed by the add connection x ↦ x + A(x) when
      ``add_connection=True`` and by nothing (x ↦ A(x)) when False; with ``stiefel=True`` the
      projections W_i^Q, W_i^K, W_i^V of every head are points of the Stiefel manifold
      St(patch_dim, patch_dim/n_heads), else unconstrained (Glorot-uniform) matrices;
    * :class:`~geoarray.nn.ResNetLayer` (eq. 15), x ↦ x + σ(Wx + b) patch by patch, unconstrained,
      always with its add connection;

    and :class:`~geoarray.nn.ClassificationLayer` (eq. 16) maps the result to class probabilities
    softmax(W x_T) (..., n_classes). There is no layer norm, no dropout and no positional encoding,
    as in the paper.

    **The add connection after the attention.** The paper applies "the multihead attention layer
    as a preprocessing step" whose output "is fed into a feedforward neural network with an add
    connection" (eq. 15) and names no add after the attention; the reference implementation
    (GeometricMachineLearning.jl, whose ``Transformer`` made the paper's MNIST figures) documents
    ``add_connection::Bool = false`` — "if the input should be added to the output after the
    MultiHeadAttention layer" — so there the attention *replaces* its input and only the ResNet
    feed-forward adds. ``add_connection=False`` (the default) is that model. With ``True`` both
    sublayers add: with Stiefel weights ‖A(x)‖ is of the size of ‖x‖, so x + A(x) can about double
    ‖x‖ per block, which at 16 blocks saturates the classifier's softmax. The default was chosen by
    measurement (``python examples/vit_digits.py --seeds 10 --epochs 40 --layers 8 16 --attention-add
    both --variants adam adam-free``; digits, Adam lr 3e-3, batch 64; test accuracy mean ± std over
    10 seeds): with Stiefel Q/K/V, 0.847 ± 0.036 without the add against 0.835 ± 0.071 with it at 8
    blocks, and 0.533 ± 0.21 against 0.101 ± 0.011 (the max-entropy stall) at 16 blocks, the paper's
    depth, where unconstrained weights stall either way (0.10). The README's digits table has the rest.

    **Which token classifies.** By default the last token x_T, as eq. 16 prescribes: the attention
    has no causal mask, so after the first block x_T is already a convex combination of all patches'
    values (plus its own add connection), and reading it out keeps the model the paper's. Because
    the blocks are equivariant under permutations of the patches (no positional encoding), the
    readout is also what breaks that symmetry: the last patch is the only one the classifier singles
    out. ``average=True`` classifies from the mean (1/T)Σ_t x_t instead, which is invariant under
    patch permutations and so cannot tell where a patch sits in the image; it is offered for
    comparison, not as the default.

    ``logits=True`` returns W x_T without the softmax (use :class:`~geoarray.nn.SoftmaxCrossEntropy`);
    the default probabilities go with :class:`~geoarray.nn.ClassificationL2Loss`, the paper's loss.
    ``activation`` is the feed-forward nonlinearity (``"tanh"`` as in the paper), ``scale`` the
    attention's softmax temperature (1 as in eq. 14).

    Layer contract: ``params = model.init(seed, xp=..., dtype=...)`` is a tuple with one entry per
    sublayer (attention, feed-forward, …, classification), ``model.manifolds()`` the matching tree
    (``Stiefel`` for the Q/K/V leaves when ``stiefel=True``, None elsewhere), ``model.apply`` and the
    analytic ``model.vjp`` are those of the underlying :class:`~geoarray.nn.Chain` (``model.chain``).
    """

    def __init__(
        self,
        patch_dim: int,
        n_patches: int,
        n_classes: int,
        *,
        n_heads: int,
        n_layers: int,
        stiefel: bool = True,
        add_connection: bool = False,
        activation: Any = "tanh",
        average: bool = False,
        logits: bool = False,
        scale: float = 1.0,
    ):
        self.patch_dim = check_size(patch_dim, "patch_dim")
        self.n_patches = check_size(n_patches, "n_patches")
        self.n_classes = check_size(n_classes, "n_classes")
        self.n_heads = check_size(n_heads, "n_heads")
        self.n_layers = check_size(n_layers, "n_layers")
        self.stiefel = bool(stiefel)
        # a string such as "false" would be truthy: accept only booleans (Python's or NumPy's)
        numpy_bool = type(add_connection).__module__ == "numpy" and type(add_connection).__name__ in ("bool", "bool_")
        if not (isinstance(add_connection, bool) or numpy_bool):
            raise ValueError(
                f"ClassificationTransformer: add_connection must be True or False, got {add_connection!r} "
                f"(pass add_connection=False for the reference package's attention without add connection)"
            )
        self.add_connection = bool(add_connection)
        self.average = bool(average)
        self.logits = bool(logits)
        blocks: list[Layer] = []
        for _ in range(self.n_layers):
            blocks.append(
                MultiHeadAttention(
                    self.patch_dim, self.n_heads, stiefel=self.stiefel, add_connection=self.add_connection, scale=scale
                )
            )
            blocks.append(ResNetLayer(self.patch_dim, activation))
        blocks.append(ClassificationLayer(self.patch_dim, self.n_classes, average=self.average, logits=self.logits))
        self.chain = Chain(*blocks)

    def __repr__(self) -> str:
        extra = "" if self.stiefel else ", stiefel=False"
        extra += ", add_connection=True" if self.add_connection else ""
        extra += ", average=True" if self.average else ""
        extra += ", logits=True" if self.logits else ""
        return (
            f"ClassificationTransformer({self.patch_dim}, {self.n_patches}, {self.n_classes}, "
            f"n_heads={self.n_heads}, n_layers={self.n_layers}{extra})"
        )

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> tuple:
        """Each sublayer from its own child seed: Haar-random Stiefel (or Glorot) Q/K/V, Glorot W, zero b."""
        return self.chain.init(seed, xp=xp, dtype=dtype, device=device)

    def manifolds(self) -> tuple:
        return self.chain.manifolds()

    def _check_x(self, x: Array) -> None:
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) < 2 or shape[-2:] != (self.n_patches, self.patch_dim):
            raise ValueError(
                f"{self!r}: x must have shape (..., n_patches={self.n_patches}, patch_dim={self.patch_dim}), "
                f"got {shape}"
            )

    def apply(self, params: Any, x: Array) -> Array:
        self._check_x(x)
        return self.chain.apply(params, x)

    def vjp(self, params: Any, x: Array):
        self._check_x(x)
        return self.chain.vjp(params, x)

    def stiefel_params(self, params: Any) -> list[Array]:
        """The Q/K/V projection arrays (n_heads, patch_dim, d_h) of every attention block."""
        return [
            p[k]
            for layer, p in zip(self.chain.layers, params, strict=True)
            if isinstance(layer, MultiHeadAttention)
            for k in ("PQ", "PK", "PV")
        ]

"""Elements of the global tangent space representation g^hor (paper, eq. 12).

For the Stiefel manifold St(N, n) = O(N)/O(N − n) with distinguished point E = [I_n; 0],

    g^hor = { [[A, −Bᵀ], [B, 0]] : A ∈ R^{n×n} skew-symmetric, B ∈ R^{(N−n)×n} }     (eq. 12)

and for the Grassmann manifold the same with A = 0; for the symplectic Stiefel manifold
SpSt(2N, 2n) = Sp(2N)/Sp(2(N − n)) it is {[[A, −B⁺], [B, 0]] : A ∈ sp(2n), B ∈ R^{2(N−n)×2n}}
(see :mod:`geoarray.manifolds.symplectic_stiefel`). These elements are what the optimizer caches
hold (Algorithm 1), so they support the arithmetic of eqs. 5–8: ``+``, ``-``, scalar and
elementwise ``*``, ``/``, ``sqrt``, ``zeros_like``.

Storage: ``A`` is kept as the full skew-symmetric n×n matrix and ``B`` as the (N−n)×n block;
the zero (N−n)×(N−n) block is never stored, so memory is O(N·n). Elementwise arithmetic acts
identically on a_ij and a_ji, so every independent entry carries one set of Adam statistics: the
second moment of A is symmetric, the velocity A₁/√(A₂ + δ) stays skew. Reductions
(:meth:`inner`, :meth:`norm`) count each independent entry once with the weight of the canonical
metric ⟨X, Y⟩ = ½ tr(XᵀY) = ½ tr(A₁ᵀA₂) + tr(B₁ᵀB₂) = Σ_{i>j} a¹_ij a²_ij + Σ b¹ b².

Both classes subclass a ``NamedTuple``: optree, ``jax.tree_util`` and ``torch.utils._pytree``
treat them as tree nodes with their fields as children, so optimizer states holding them are plain
trees that ``jax.jit`` and checkpointing understand, with no registration step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from .._backend import array_namespace
from .._backend import device as _device
from ._symplectic import broadcast_shapes, stack_rows, symplectic_inverse

__all__ = ["GrassmannHorizontal", "HorizontalElement", "StiefelHorizontal", "SymplecticStiefelHorizontal"]

from .._typing import Array


def _fields(x: Any, like: Any) -> tuple:
    """Operand fields for arithmetic with ``like``: same class → its fields, scalar → repeated."""
    if isinstance(x, type(like)):
        return tuple(x)
    if isinstance(x, tuple):
        raise TypeError(f"cannot combine {type(like).__name__} with {type(x).__name__}")
    return (x,) * len(like)


class HorizontalElement:
    """Base of the elements of g^hor: NamedTuples of arrays with fieldwise arithmetic and a metric.

    Subclasses are NamedTuples (pytrees for optree, ``jax.tree_util`` and ``torch.utils._pytree``)
    whose fields are the independent blocks of the element. Tuple concatenation/repetition are
    replaced by elementwise arithmetic on the fields, so optimizer caches (eqs. 5–8) are the same
    code for vector spaces and manifolds. ``metric_weights`` gives, per field, the weight w with
    ⟨X, Y⟩ = Σ_fields w·Σ x⊙y, the canonical metric ½tr(XᵀY) counted on independent entries.
    """

    __slots__ = ()
    metric_weights: tuple[float, ...] = ()

    if TYPE_CHECKING:
        # the tuple interface the NamedTuple subclasses supply (this base is a mixin, not a tuple)
        def __iter__(self) -> Iterator[Array]: ...
        def __getitem__(self, index: Any) -> Any: ...
        def __len__(self) -> int: ...

    def inner(self, other: Any) -> Array:
        """The canonical metric ½tr(XᵀY) of g^hor, per batch element."""
        raise NotImplementedError

    def norm(self) -> Array:
        return array_namespace(*self).sqrt(self.inner(self))

    def _map(self, fn, *others):
        cols = [_fields(o, self) for o in others]
        return type(self)(*(fn(a, *(c[i] for c in cols)) for i, a in enumerate(self)))

    def __add__(self, other):
        return self._map(lambda a, b: a + b, other)

    __radd__ = __add__

    def __sub__(self, other):
        return self._map(lambda a, b: a - b, other)

    def __rsub__(self, other):
        return self._map(lambda a, b: b - a, other)

    def __mul__(self, other):
        return self._map(lambda a, b: a * b, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self._map(lambda a, b: a / b, other)

    def __rtruediv__(self, other):
        return self._map(lambda a, b: b / a, other)

    def __neg__(self):
        return self._map(lambda a: -a)

    def __pos__(self):
        return self

    def sqrt(self):
        return self._map(lambda a: array_namespace(a).sqrt(a))

    def zeros_like(self):
        return self._map(lambda a: array_namespace(a).zeros_like(a))

    @property
    def dtype(self):
        return self[-1].dtype

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self[-1].shape[:-2])


class _StiefelFields(NamedTuple):
    A: Array
    B: Array


class _GrassmannFields(NamedTuple):
    B: Array


class StiefelHorizontal(HorizontalElement, _StiefelFields):
    """[[A, −Bᵀ], [B, 0]] ∈ g^hor of St(N, n): A (..., n, n) skew, B (..., N−n, n)."""

    __slots__ = ()
    #: ⟨X, Y⟩ = ½ Σ A₁⊙A₂ + Σ B₁⊙B₂ (the canonical metric, see :meth:`inner`)
    metric_weights = (0.5, 1.0)

    def to_dense(self) -> Array:
        """The (..., N, N) matrix [[A, −Bᵀ], [B, 0]] (for tests and docs; O(N²) memory)."""
        xp = array_namespace(A=self.A, B=self.B)
        top = xp.concat([self.A, -xp.matrix_transpose(self.B)], axis=-1)
        m = self.B.shape[-2]
        zeros = xp.zeros((*self.B.shape[:-2], m, m), dtype=self.B.dtype, device=_device(self.B))
        bottom = xp.concat([self.B, zeros], axis=-1)
        return xp.concat([top, bottom], axis=-2)

    def inner(self, other: StiefelHorizontal) -> Array:
        """Canonical metric ½ tr(XᵀY) = ½ tr(A₁ᵀA₂) + tr(B₁ᵀB₂), per batch element."""
        xp = array_namespace(self.A, other.A)
        return xp.sum(self.A * other.A, axis=(-2, -1)) / 2 + xp.sum(self.B * other.B, axis=(-2, -1))

    def norm(self) -> Array:
        return array_namespace(self.A).sqrt(self.inner(self))


class GrassmannHorizontal(HorizontalElement, _GrassmannFields):
    """[[0, −Bᵀ], [B, 0]] ∈ g^hor of Gr(N, n): B (..., N−n, n)."""

    __slots__ = ()
    metric_weights = (1.0,)

    def to_dense(self) -> Array:
        xp = array_namespace(B=self.B)
        n = self.B.shape[-1]
        zeros_a = xp.zeros((*self.B.shape[:-2], n, n), dtype=self.B.dtype, device=_device(self.B))
        return StiefelHorizontal(zeros_a, self.B).to_dense()

    def inner(self, other: GrassmannHorizontal) -> Array:
        """Canonical metric ½ tr(XᵀY) = tr(B₁ᵀB₂), per batch element."""
        xp = array_namespace(self.B, other.B)
        return xp.sum(self.B * other.B, axis=(-2, -1))

    def norm(self) -> Array:
        return array_namespace(self.B).sqrt(self.inner(self))


class _SymplecticFields(NamedTuple):
    A11: Array
    A12: Array
    A21: Array
    B: Array


class SymplecticStiefelHorizontal(HorizontalElement, _SymplecticFields):
    """[[A, −B⁺], [B, 0]] ∈ g^hor of SpSt(2N, 2n), in the coordinate order (E, F).

    Fields (the independent blocks, so elementwise optimizer arithmetic treats every independent
    entry once and keeps the structure):

    * ``A11`` (..., n, n), ``A12`` (..., n, n) symmetric, ``A21`` (..., n, n) symmetric:
      A = [[A11, A12], [A21, −A11ᵀ]] ∈ sp(2n). Elementwise operations map symmetric matrices to
      symmetric matrices, so every cache and velocity stays in g^hor.
    * ``B`` (..., 2(N−n), 2n): rows q_{n+1}…q_N then p_{n+1}…p_N; B⁺ = 𝕁_{2n}ᵀBᵀ𝕁_{2(N−n)}.
    """

    __slots__ = ()
    #: Σ A11¹A11² + ½Σ A12¹A12² + ½Σ A21¹A21² + Σ B¹B² (see :meth:`inner`)
    metric_weights = (1.0, 0.5, 0.5, 1.0)

    def hamiltonian(self) -> Array:
        """A = [[A11, A12], [A21, −A11ᵀ]] as a (..., 2n, 2n) array."""
        xp = array_namespace(A11=self.A11, A12=self.A12, A21=self.A21)
        top = xp.concat([self.A11, self.A12], axis=-1)
        bottom = xp.concat([self.A21, -xp.matrix_transpose(self.A11)], axis=-1)
        return xp.concat([top, bottom], axis=-2)

    def to_dense(self) -> Array:
        """The (..., 2N, 2N) matrix of sp(2N) in the original (q, p) coordinates (tests and docs)."""
        xp = array_namespace(A11=self.A11, B=self.B)
        A = self.hamiltonian()
        batch = broadcast_shapes(tuple(A.shape[:-2]), tuple(self.B.shape[:-2]))
        A = xp.broadcast_to(A, (*batch, *A.shape[-2:]))
        B = xp.broadcast_to(self.B, (*batch, *self.B.shape[-2:]))
        m2 = B.shape[-2]
        empty = (*A.shape[:-2], A.shape[-1], 0)
        Bplus = symplectic_inverse(B, xp) if m2 else xp.zeros(empty, dtype=A.dtype, device=_device(A))
        zeros = xp.zeros((*A.shape[:-2], m2, m2), dtype=A.dtype, device=_device(A))
        # columns in (E, F) order, rows put back in (q, p) order; then the same for the columns
        cols_e = stack_rows([A, B], xp)  # (..., 2N, 2n)
        cols_f = stack_rows([-Bplus, zeros], xp)  # (..., 2N, 2m)
        W_t = xp.matrix_transpose(xp.concat([cols_e, cols_f], axis=-1))  # rows in (E, F) order
        n2 = A.shape[-1]
        return xp.matrix_transpose(stack_rows([W_t[..., :n2, :], W_t[..., n2:, :]], xp))

    def inner(self, other: SymplecticStiefelHorizontal) -> Array:
        """½tr(W₁ᵀW₂) = ½tr(A₁ᵀA₂) + tr(B₁ᵀB₂), per batch element.

        In the stored blocks: Σ A11¹A11² + ½Σ A12¹A12² + ½Σ A21¹A21² + Σ B¹B², i.e. weight 1 on every
        entry of A11, B and on each off-diagonal pair of A12, A21, and ½ on their diagonals. It
        equals the metric g_Y of the represented tangent vectors when λ(Y) is orthogonal (YᵀY = I).
        """
        xp = array_namespace(self.A11, other.A11)

        def dot(a, b):
            return xp.sum(a * b, axis=(-2, -1))

        return (
            dot(self.A11, other.A11) + (dot(self.A12, other.A12) + dot(self.A21, other.A21)) / 2 + dot(self.B, other.B)
        )

    def norm(self) -> Array:
        return array_namespace(self.A11).sqrt(self.inner(self))

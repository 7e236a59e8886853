"""The one ``Array`` type of geoarray's annotations, defined here and imported everywhere else.

An ``Array`` is an array of whichever namespace the caller works in: ``numpy.ndarray``,
``torch.Tensor``, ``jax.Array``, ``cupy.ndarray`` or ``array_api_strict``'s array — the inputs decide
where the work runs (array API standard, https://data-apis.org/array-api/). These types share no base
class, and ``torch.Tensor`` and NumPy < 2 arrays do not implement the standard's
``__array_namespace__`` (array-api-compat supplies their namespaces), so a Protocol that all of them
satisfy would have to leave out what makes an array an array. To a type checker ``Array`` is therefore
``Any``; :class:`ArrayAPIArray` writes down the standard's interface that geoarray relies on (the
attributes read through ``array_api_compat``), for readers and for code that wants to check it.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias

#: An array of any supported namespace (NumPy, PyTorch, JAX, CuPy, array-api-strict); ``Any`` to a type
#: checker, because those types share no interface a checker could verify (see the module docstring).
Array: TypeAlias = Any


class ArrayAPIArray(Protocol):
    """The array API standard's array object, the part geoarray uses: ``shape``, ``dtype``, ``device``,
    ``ndim``, ``mT``, indexing and the arithmetic and comparison operators (through the namespace that
    ``array_api_compat.array_namespace`` returns for it)."""

    @property
    def shape(self) -> tuple[int | None, ...]: ...

    @property
    def dtype(self) -> Any: ...

    @property
    def device(self) -> Any: ...

    @property
    def ndim(self) -> int: ...

    @property
    def mT(self) -> ArrayAPIArray: ...

    def __getitem__(self, key: Any, /) -> ArrayAPIArray: ...


__all__ = ["Array", "ArrayAPIArray"]

"""Namespaces, devices and the dtype policy: which backend an array belongs to, and what it may hold.

* :func:`array_namespace` resolves the namespace of the inputs (and refuses mixed namespaces with a
  message naming both), :func:`as_namespace` turns a user-supplied module (``numpy``, ``torch``,
  ``jax.numpy``, ``cupy``, ``array_api_strict``) into the standard-compatible namespace;
* :func:`backend_name` and the ``is_*`` predicates name the backend of a namespace;
* :func:`resolve_dtype` / :func:`default_float` implement the dtype policy: float64 wherever the
  backend (and device) has it, float32 otherwise; asking for float64 where it is unavailable is an
  error that says what to do (for JAX: enable ``jax_enable_x64``).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import array_api_compat as _compat
import numpy as np

from .._typing import Array

Namespace = Any

_SCALARS = (bool, int, float, complex)


# --------------------------------------------------------------------------------------------
# Namespaces
# --------------------------------------------------------------------------------------------


# The module names of each backend's namespaces, as array_api_compat's is_*_namespace predicates list
# them. Those predicates are functools.lru_cache wrappers, and dynamo warns of "potential silent
# incorrectness" at each such wrapper it traces: a user's first torch.compile of a step printed it.
_COMPAT = _compat.__name__
_NAMESPACE_NAMES = {
    "numpy": frozenset({"numpy", _COMPAT + ".numpy"}),
    "torch": frozenset({"torch", _COMPAT + ".torch"}),
    "jax": frozenset({"jax.numpy", "jax.experimental.array_api"}),
    "cupy": frozenset({"cupy", _COMPAT + ".cupy"}),
    "array_api_strict": frozenset({"array_api_strict"}),
}


def _named(xp: Namespace, backend: str) -> bool:
    name = getattr(xp, "__name__", None)
    return isinstance(name, str) and name in _NAMESPACE_NAMES[backend]


def is_numpy(xp: Namespace) -> bool:
    return _named(xp, "numpy")


def is_torch(xp: Namespace) -> bool:
    return _named(xp, "torch")


def is_jax(xp: Namespace) -> bool:
    return _named(xp, "jax")


def is_cupy(xp: Namespace) -> bool:
    return _named(xp, "cupy")


def is_array_api_strict(xp: Namespace) -> bool:
    return _named(xp, "array_api_strict")


def writable(xp: Namespace) -> bool:
    """Whether this namespace's arrays take in-place writes, ``x[index] = value`` (the array API's
    ``__setitem__``): every backend of the matrix but JAX, whose arrays are immutable (it donates buffers
    to a jitted function instead)."""
    return not is_jax(xp)


_BACKEND_NAMES: dict[Any, str] = {}


def backend_name(xp: Namespace) -> str:
    """Short name of the backend of ``xp``: numpy, torch, jax, cupy, array_api_strict, or its module name."""
    try:
        return _BACKEND_NAMES[xp]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    name = _backend_name(xp)
    try:
        # memoised: every fast-path lookup asks, about 20 times per optimizer step (NumPy: 1 µs each)
        _BACKEND_NAMES[xp] = name
    except TypeError:
        pass
    return name


def _backend_name(xp: Namespace) -> str:
    for name, pred in (
        ("numpy", is_numpy),
        ("torch", is_torch),
        ("jax", is_jax),
        ("cupy", is_cupy),
        ("array_api_strict", is_array_api_strict),
    ):
        if pred(xp):
            return name
    return getattr(xp, "__name__", type(xp).__name__)


def _describe(x: Any) -> str:
    try:
        return backend_name(_compat.array_namespace(x))
    except TypeError:
        return type(x).__module__ + "." + type(x).__qualname__


def array_namespace(*arrays: Any, **named: Any) -> Namespace:
    """The standard-compatible namespace shared by the inputs.

    Positional and keyword arguments are arrays (``None`` and Python scalars are ignored); keyword
    names are only used to make the error message name the offending arguments. Mixed namespaces
    (e.g. a NumPy array and a torch tensor) raise ``TypeError`` naming each backend involved.
    """
    values = arrays + tuple(named.values()) if named else arrays
    # the namespace of a torch.Tensor, numpy.ndarray or cupy.ndarray (or of a subclass: a Parameter), of an
    # array_api_strict.Array and of a JAX array or tracer depends on its type alone; the optimizers ask a few
    # dozen times per step, and the general route below costs ≈ 1.5 µs per call (array-api-strict: ≈ 20 µs, its
    # __array_namespace__ checks the version), and traces, under torch.compile, array_api_compat's lru_cache
    # wrappers (a warning)
    ns = None
    for a in values:
        if a is None:
            continue
        found = _NAMESPACE_OF_TYPE.get(type(a)) or _namespace_of_type(type(a))
        if found is None or (ns is not None and found is not ns):
            ns = None
            break
        ns = found
    if ns is not None:
        return ns
    items = [(f"argument {i}", a) for i, a in enumerate(arrays)] + list(named.items())
    items = [(k, a) for k, a in items if a is not None and not isinstance(a, _SCALARS)]
    if not items:
        raise TypeError("no array among the inputs: cannot tell which array namespace to use")
    try:
        ns = _compat.array_namespace(*(a for _, a in items))
    except TypeError:
        pass
    else:
        for _, a in items:
            if type(a).__module__.split(".")[0] in _TYPED_NAMESPACES:
                _NAMESPACE_OF_TYPE[type(a)] = ns
        return ns
    kinds: dict[str, list] = {}
    for key, a in items:
        kinds.setdefault(_describe(a), []).append(key)
    if len(kinds) > 1:
        detail = "; ".join(f"{', '.join(keys)}: {kind}" for kind, keys in kinds.items())
        raise TypeError(
            f"inputs come from different array libraries ({detail}); convert them to one backend (and one device) first"
        ) from None
    described, keys = next(iter(kinds.items()))
    raise TypeError(f"{', '.join(keys)} is not an array of a supported array library (got {described})")


def torch_module() -> ModuleType | None:
    """``torch``, imported, or None where it is not installed: the default namespace of geoopt's call forms
    (``M.random(*size)`` draws torch tensors, as geoopt does)."""
    try:
        import torch
    except ModuleNotFoundError:
        return None
    return torch


def as_namespace(xp: Any) -> Namespace:
    """The standard-compatible namespace for a user-supplied module.

    ``numpy``, ``torch`` and ``cupy`` map to their ``array_api_compat`` wrappers; ``jax.numpy`` and
    ``array_api_strict`` are returned as they are; a namespace that already declares
    ``__array_api_version__`` is accepted unchanged.
    """
    if is_numpy(xp):
        import array_api_compat.numpy as np_compat

        return _known(np_compat, np.ndarray)
    if is_torch(xp):
        import array_api_compat.torch as torch_compat
        import torch

        return _known(torch_compat, torch.Tensor)
    if is_cupy(xp):
        import array_api_compat.cupy as cupy_compat
        import cupy

        return _known(cupy_compat, cupy.ndarray)
    if is_jax(xp) or is_array_api_strict(xp) or hasattr(xp, "__array_api_version__"):
        return xp
    if isinstance(xp, ModuleType) and xp.__name__ == "jax":
        import jax.numpy as jnp

        return jnp
    raise TypeError(
        "xp must be an array namespace (numpy, torch, jax.numpy, cupy, array_api_strict or any "
        f"array-API-compatible module), got {xp!r}"
    )


_NAMESPACE_OF_TYPE: dict[type, Namespace] = {}
#: the top-level modules whose array types :func:`array_namespace` remembers (jaxlib: jax.Array's ArrayImpl)
_TYPED_NAMESPACES = ("torch", "numpy", "cupy", "array_api_strict", "jax", "jaxlib")


def _known(ns: Namespace, array_type: type) -> Namespace:
    # so that array_namespace answers from _NAMESPACE_OF_TYPE for these arrays (and their subclasses) even
    # when the first one it sees is inside torch.compile, where array_api_compat's resolution warns
    if array_type not in _NAMESPACE_OF_TYPE:
        _NAMESPACE_OF_TYPE[array_type] = ns
    return ns


def _namespace_of_type(kind: type) -> Namespace | None:
    """The namespace of arrays of type ``kind`` if a class it derives from was resolved before: array_api_compat
    resolves a subclass of torch.Tensor, numpy.ndarray or cupy.ndarray as its base."""
    for base in kind.__mro__[1:]:
        ns = _NAMESPACE_OF_TYPE.get(base)
        if ns is not None:
            return ns
    return None


_NDARRAY = np.ndarray


def device(x: Array) -> Any:
    """The device an array lives on (``array_api_compat.device``)."""
    # what array_api_compat returns, without its 1–3 µs of dispatch (asked per leaf, per step)
    if type(x) is _NDARRAY:
        return "cpu"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.device
    return _compat.device(x)


def commit_to(tree: Any, xp: Any, dev: Any) -> Any:
    """``tree`` with its arrays committed to device ``dev`` — on JAX (``jax.device_put``); on the other
    backends, which have no such notion, ``tree`` itself.

    JAX compiles a jitted function again when an argument changes from uncommitted (made by ``jnp`` on
    the default device) to committed (placed on a device, or the output of a call that had a committed
    argument). A loop whose first call gets uncommitted parameters and a committed state or batch, and
    whose later calls get its committed outputs, compiles every jitted function twice; committing the
    loop's carried values before the first call compiles them once."""
    if not is_jax(xp):
        return tree
    import jax

    return jax.device_put(tree, dev)


def to_host(x: Array) -> Any:
    """A NumPy copy of ``x`` (for saving and printing; the one sanctioned device→host transfer)."""
    import numpy as np

    if isinstance(x, np.generic):  # NumPy scalars from 0-d arithmetic
        return np.asarray(x).copy()
    xp = array_namespace(x=x)
    if is_numpy(xp):
        return np.array(x, copy=True)
    if is_torch(xp):
        return x.detach().cpu().numpy().copy()
    if is_cupy(xp):
        return x.get()
    if is_jax(xp):
        return np.array(x, copy=True)
    return np.array(np.from_dlpack(x), copy=True)


def as_array(x: Any) -> Array:
    """``x`` as an array: NumPy's 0-d arithmetic and full reductions return NumPy scalars, which are
    not arrays of any namespace (``np.float64(1) + 1`` is a scalar); every other backend returns arrays."""
    if isinstance(x, _np_generic()):
        import numpy as np

        return np.asarray(x)
    return x


def _np_generic() -> type:
    import numpy as np

    return np.generic


def dtype_name(dtype: Any) -> str:
    """``float32`` for ``numpy.float32``, ``torch.float32``, ``array_api_strict.float32``, ``jnp.bfloat16``, …"""
    for attr in ("name", "__name__"):  # NumPy/JAX dtype objects, then scalar types such as np.float16
        name = getattr(dtype, attr, None)
        if isinstance(name, str):
            return name
    return str(dtype).rsplit(".", 1)[-1]


def index_dtype(xp: Namespace) -> Any:
    """The integer dtype of counters: int32 under JAX (int64 needs jax_enable_x64), int64 elsewhere."""
    return xp.int32 if is_jax(xp) else xp.int64


def from_host(host: Any, xp: Namespace, dtype: Any = None, device: Any = None) -> Array:
    """``xp.asarray(host, dtype=dtype, device=device)`` for host data: a NumPy array, or a Python scalar or
    nested sequence with a ``dtype``.

    On JAX with a device, ``jax.device_put`` of the NumPy array in that dtype: the same committed array,
    but eager ``jnp.asarray`` with a device compiles two programs for every new shape (a conversion and a
    copy; jax 0.10) where ``device_put`` compiles none. A test session of eager JAX made ~700 of its
    ~12,000 compilations there. ``device_put`` may share a NumPy array's memory on the CPU (``jnp.asarray``
    does not), so it is given a private copy."""
    if device is not None and is_jax(xp) and (dtype is not None or isinstance(host, np.ndarray)):
        import jax

        return jax.device_put(np.array(host, dtype=None if dtype is None else np.dtype(dtype), copy=True), device)
    if device is None:
        return xp.asarray(host, dtype=dtype)
    return xp.asarray(host, dtype=dtype, device=device)


def host_seed(seed: Any, xp: Any = None) -> Any:
    """``seed`` as a host draw takes it (:mod:`geoarray.random`): a ``torch.Generator`` becomes one
    63-bit integer drawn from it (advancing it), and ``None`` with a torch namespace ``xp`` draws that
    integer from torch's default generator (the one ``torch.manual_seed`` sets); anything else is
    returned unchanged, for the caller to validate. torch is imported only when one of these is given."""
    if seed is None and xp is not None and is_torch(as_namespace(xp)):
        import torch

        seed = torch.default_generator
    if type(seed).__module__.split(".")[0] == "torch" and type(seed).__name__ == "Generator":
        import torch

        return int(torch.randint(0, 2**63 - 1, (), generator=seed, device=seed.device).item())
    return seed


def from_host_like(host: Any, like: Array) -> Array:
    """A copy of the NumPy array ``host`` in the namespace, dtype, device and memory layout of ``like``.

    The layout matters on torch: a column-major tensor (LAPACK's QR returns one) and its row-major
    copy go through different BLAS kernels that round differently, so a checkpoint restored in another
    layout would not resume bit-exactly. Fresh memory also avoids the alignment of a file buffer.
    """
    xp = array_namespace(like=like)
    if is_torch(xp):
        import torch

        return torch.empty_like(like).copy_(torch.from_numpy(host))
    return xp.asarray(host, dtype=like.dtype, device=device(like), copy=True)


# --------------------------------------------------------------------------------------------
# Dtype policy
# --------------------------------------------------------------------------------------------

_FLOAT_NAMES = ("float32", "float64")


def _float_dtypes(xp: Namespace, dev: Any) -> dict[str, Any]:
    info = xp.__array_namespace_info__()
    try:
        return dict(info.dtypes(device=dev, kind="real floating"))
    except TypeError:  # an older info API without the device keyword
        return dict(info.dtypes(kind="real floating"))


def default_float(xp: Namespace, device: Any = None) -> Any:
    """float64 where the backend/device supports it, else float32 (JAX without x64, MPS, ...)."""
    xp = as_namespace(xp)
    floats = _float_dtypes(xp, device)
    return floats.get("float64", floats.get("float32"))


def _float64_missing_message(xp: Namespace) -> str:
    if is_jax(xp):
        return (
            "float64 was requested but JAX runs in 32-bit mode; enable it at program start with "
            "jax.config.update('jax_enable_x64', True) or the environment variable JAX_ENABLE_X64=1"
        )
    return f"float64 was requested but the {backend_name(xp)} backend/device has no float64"


def resolve_dtype(xp: Namespace, dtype: Any = None, device: Any = None, *, name: str = "dtype") -> Any:
    """The dtype object of ``xp`` for a user dtype argument.

    ``None`` gives :func:`default_float`; a name (``"float32"``, ``"float64"``) or a dtype object of
    the namespace is checked to be a real floating dtype available on ``device``.
    """
    xp = as_namespace(xp)
    if dtype is None:
        return default_float(xp, device)
    floats = _float_dtypes(xp, device)
    if isinstance(dtype, str):
        if dtype not in _FLOAT_NAMES:
            raise TypeError(f"{name} must be 'float32' or 'float64' (or a dtype object), got {dtype!r}")
        if dtype not in floats:
            raise TypeError(_float64_missing_message(xp))
        return floats[dtype]
    for dt in floats.values():
        if dtype == dt:
            return dt
    try:
        is_float = xp.isdtype(dtype, "real floating")
    except Exception:  # not a dtype of this namespace at all
        is_float = False
    if is_float and dtype == getattr(xp, "float64", None):
        raise TypeError(_float64_missing_message(xp))
    raise TypeError(f"{name} must be a real floating dtype of {backend_name(xp)} ({', '.join(floats)}), got {dtype!r}")


def is_compiling() -> bool:
    """True while ``torch.compile`` traces (dynamo): Python-side checks that its polyfills cannot run are skipped."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


_REAL_FLOATING: dict[tuple[Any, Any], bool] = {}


def _is_real_floating(xp: Namespace, dtype: Any) -> bool:
    # memoised per (namespace, dtype): NumPy's isdtype is Python (3 µs), and every manifold method
    # checks its inputs (about 8 times per optimizer step). Not under torch.compile: dynamo (torch
    # 2.11) refused the (namespace, dtype) lookup as unhashable, and the check costs nothing once compiled.
    if is_compiling():
        # array_api_compat's isdtype for torch answers with dtype.is_floating_point after a dozen traced
        # instructions of dispatch on the kind
        torch = sys.modules["torch"]
        if isinstance(dtype, torch.dtype):
            return dtype.is_floating_point
        return bool(xp.isdtype(dtype, "real floating"))
    try:
        return _REAL_FLOATING[xp, dtype]
    except (KeyError, TypeError):
        pass
    answer = bool(xp.isdtype(dtype, "real floating"))
    try:
        _REAL_FLOATING[xp, dtype] = answer
    except TypeError:
        pass
    return answer


def check_real_floating(x: Array, name: str, xp: Namespace | None = None) -> None:
    """Raise ``TypeError`` naming ``name`` unless ``x`` has a real floating dtype."""
    xp = array_namespace(x) if xp is None else xp
    if not _is_real_floating(xp, x.dtype):
        raise TypeError(f"{name} must have a real floating dtype (float32 or float64), got {x.dtype}")

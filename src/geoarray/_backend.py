"""Backend facts, kept in one place.

Everything in geoarray is written once against the Python array API standard. The few places where
a backend differs, or has a faster native routine, live here:

* :func:`array_namespace` resolves the namespace of the inputs (and refuses mixed namespaces with a
  message naming both), :func:`as_namespace` turns a user-supplied module (``numpy``, ``torch``,
  ``jax.numpy``, ``cupy``, ``array_api_strict``) into the standard-compatible namespace;
* :func:`backend_name` and the ``is_*`` predicates name the backend of a namespace;
* :func:`resolve_dtype` / :func:`default_float` implement the dtype policy: float64 wherever the
  backend (and device) has it, float32 otherwise; asking for float64 where it is unavailable is an
  error that says what to do (for JAX: enable ``jax_enable_x64``);
* a small registry of fast paths (:func:`fast_path`): a generic array-API function asks for a native
  implementation on the current backend and falls back to its own code when there is none.

Heavy backends (torch, jax, cupy) are never imported here; their presence is read off
``sys.modules`` or off the arrays the user passes in.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import array_api_compat as _compat
import numpy as np
import optree

__all__ = [
    "all_finite",
    "array_namespace",
    "as_namespace",
    "backend_name",
    "check_real_floating",
    "default_float",
    "device",
    "fast_path",
    "is_array_api_strict",
    "is_cupy",
    "is_jax",
    "is_numpy",
    "is_torch",
    "register_fast_path",
    "resolve_dtype",
]

Namespace = Any
Array = Any

_SCALARS = (bool, int, float, complex)


# --------------------------------------------------------------------------------------------
# Namespaces
# --------------------------------------------------------------------------------------------


def is_numpy(xp: Namespace) -> bool:
    return isinstance(getattr(xp, "__name__", None), str) and _compat.is_numpy_namespace(xp)


def is_torch(xp: Namespace) -> bool:
    return isinstance(getattr(xp, "__name__", None), str) and _compat.is_torch_namespace(xp)


def is_jax(xp: Namespace) -> bool:
    return isinstance(getattr(xp, "__name__", None), str) and _compat.is_jax_namespace(xp)


def is_cupy(xp: Namespace) -> bool:
    return isinstance(getattr(xp, "__name__", None), str) and _compat.is_cupy_namespace(xp)


def is_array_api_strict(xp: Namespace) -> bool:
    return isinstance(getattr(xp, "__name__", None), str) and _compat.is_array_api_strict_namespace(xp)


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
    if values:
        # the namespace of a torch.Tensor, numpy.ndarray or cupy.ndarray depends on its type alone; the
        # optimizers ask a few dozen times per step, and the general route below costs ≈ 1.5 µs per call
        kind = type(values[0])
        ns = _NAMESPACE_OF_TYPE.get(kind)
        if ns is not None:
            for a in values:
                if type(a) is not kind and a is not None:
                    break
            else:
                return ns
    items = [(f"argument {i}", a) for i, a in enumerate(arrays)] + list(named.items())
    items = [(k, a) for k, a in items if a is not None and not isinstance(a, _SCALARS)]
    if not items:
        raise TypeError("no array among the inputs: cannot tell which array namespace to use")
    kind = type(items[0][1])
    try:
        ns = _compat.array_namespace(*(a for _, a in items))
    except TypeError:
        pass
    else:
        if all(type(a) is kind for _, a in items) and kind.__module__.split(".")[0] in ("torch", "numpy", "cupy"):
            _NAMESPACE_OF_TYPE[kind] = ns
        return ns
    kinds = {}
    for key, a in items:
        kinds.setdefault(_describe(a), []).append(key)
    if len(kinds) > 1:
        detail = "; ".join(f"{', '.join(keys)}: {kind}" for kind, keys in kinds.items())
        raise TypeError(
            f"inputs come from different array libraries ({detail}); convert them to one backend (and one device) first"
        ) from None
    kind, keys = next(iter(kinds.items()))
    raise TypeError(f"{', '.join(keys)} is not an array of a supported array library (got {kind})")


def as_namespace(xp: Any) -> Namespace:
    """The standard-compatible namespace for a user-supplied module.

    ``numpy``, ``torch`` and ``cupy`` map to their ``array_api_compat`` wrappers; ``jax.numpy`` and
    ``array_api_strict`` are returned as they are; a namespace that already declares
    ``__array_api_version__`` is accepted unchanged.
    """
    if is_numpy(xp):
        import array_api_compat.numpy as np_compat

        return np_compat
    if is_torch(xp):
        import array_api_compat.torch as torch_compat

        return torch_compat
    if is_cupy(xp):
        import array_api_compat.cupy as cupy_compat

        return cupy_compat
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


def is_compiling() -> bool:
    """True while ``torch.compile`` traces (dynamo): Python-side checks that its polyfills cannot run are skipped."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def all_finite(x: Array, xp: Namespace) -> Array:
    """A 0-d boolean array: every entry of x is finite.

    Eager torch: isfinite(Σ x·0), two passes (x·0 is ±0 where x is finite and NaN where it is not,
    and a sum with a NaN is NaN; no overflow, unlike isfinite(Σ x)) instead of the five of torch's
    ``all(isfinite(x))`` (abs, ne, eq, mul, all): 0.12 ms instead of 1.3 ms on a 4096×128 float32
    gradient. NumPy's isfinite is one pass (and x·0 would warn), and compilers (JAX, torch.compile)
    fuse ``all(isfinite(x))`` into one pass and must not be offered x·0 to simplify.
    """
    if is_torch(xp) and not is_compiling():
        return xp.isfinite(xp.sum(x * 0))
    return xp.all(xp.isfinite(x))


def all_finite_on_host(arrays: list, xp: Namespace) -> bool:
    """Every entry of every array is finite, read to the host (eager use only).

    torch: one pass and one scalar read, Σ Σ x: finite when every entry is; when it is not (a
    non-finite entry, or finite entries whose sum overflows) the exact :func:`all_finite` of each
    array decides (4096×128 float32: 30 µs instead of the 97 µs of Σ x·0). Elsewhere
    :func:`all_finite` per array (NumPy would warn on inf − inf in a sum).
    """
    if is_torch(xp):
        total = xp.sum(arrays[0])
        for x in arrays[1:]:
            total = total + xp.sum(x)
        if math.isfinite(float(total)):
            return True
    return all(bool(all_finite(x, xp)) for x in arrays)


def is_traced(x: Any) -> bool:
    """True inside ``jax.jit``/``vmap`` (x is a tracer) or while ``torch.compile`` traces: values cannot be
    read on the host there."""
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.core.Tracer):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


# --------------------------------------------------------------------------------------------
# Dtype policy
# --------------------------------------------------------------------------------------------

# -- static pytree nodes ----------------------------------------------------------------------------
#
# Optimizer states carry what ``update`` needs besides arrays (the layout of the parameter tree: its
# paths, groups and manifolds), so that an optimizer object holds configuration only. Such a node must
# flatten to no leaves in every pytree registry a state meets — optree (the library's), jax.tree_util
# (jax.jit, optax) and torch.utils._pytree — and come back as the same object: its value is static
# (hashable, compared by ``==``, part of the tree structure, so jax.jit specialises on it).

_STATIC_NODES: list[type] = []
_STATIC_REGISTERED: dict[str, set[type]] = {"jax": set(), "torch": set()}


def register_static_node(cls: type) -> type:
    """Class decorator: instances of ``cls`` are pytree nodes with no children whose value is static.

    Registered with optree at once and with ``jax.tree_util`` / ``torch.utils._pytree`` by
    :func:`ensure_static_nodes` (called by the optimizers' ``init`` and by ``geoarray.jax`` /
    ``geoarray.torch`` on import), so importing geoarray imports neither framework.
    """
    optree.register_pytree_node(
        cls,
        lambda node: ((), node, ()),
        lambda node, children: node,
        namespace=optree.registry.__GLOBAL_NAMESPACE,  # type: ignore[attr-defined]
    )
    _STATIC_NODES.append(cls)
    ensure_static_nodes()
    return cls


def ensure_static_nodes() -> None:
    """Register the static node classes with jax.tree_util and torch.utils._pytree, where imported."""
    if "jax" in sys.modules:
        import jax

        for cls in _STATIC_NODES:
            if cls not in _STATIC_REGISTERED["jax"]:
                jax.tree_util.register_pytree_node(cls, lambda node: ((), node), lambda node, children: node)
                _STATIC_REGISTERED["jax"].add(cls)
    if "torch" in sys.modules:
        import torch.utils._pytree as torch_pytree

        for cls in _STATIC_NODES:
            if cls not in _STATIC_REGISTERED["torch"]:
                torch_pytree.register_pytree_node(
                    cls, lambda node: ([], node), lambda children, node: node, serialized_type_name=cls.__qualname__
                )
                _STATIC_REGISTERED["torch"].add(cls)


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


_REAL_FLOATING: dict[tuple[Any, Any], bool] = {}


def _is_real_floating(xp: Namespace, dtype: Any) -> bool:
    # memoised per (namespace, dtype): NumPy's isdtype is Python (3 µs), and every manifold method
    # checks its inputs (about 8 times per optimizer step)
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


# --------------------------------------------------------------------------------------------
# Compilation
# --------------------------------------------------------------------------------------------


@functools.cache
def _jax_jit(fn: Callable[..., Any], static_argnames: tuple[str, ...]) -> Callable[..., Any]:
    import jax

    return jax.jit(fn, static_argnames=static_argnames)


def compiled(fn: Callable[..., Any], xp: Namespace, *static_argnames: str) -> Callable[..., Any]:
    """``fn`` itself, or on JAX a cached ``jax.jit`` of it.

    Eager JAX dispatches (and on first use compiles) every small op separately, which makes the
    generic kernels (a Padé polynomial and masked squarings, a loop of Householder reflections)
    100× slower than one compiled call. Inside a user's own ``jax.jit`` the inner jit is inlined.
    ``static_argnames`` name the non-array arguments (the namespace, sizes, flags).
    """
    if is_jax(xp):
        return _jax_jit(fn, tuple(static_argnames))
    return fn


def select(
    value: Array, thresholds: tuple[float, ...], branches: list[Callable[[Any], Any]], operand: Any, xp: Namespace
) -> Any:
    """``branches[i](operand)`` for the first i with ``value ≤ thresholds[i]`` (ascending), else the last
    branch (also for a NaN ``value``); ``branches`` has one more entry than ``thresholds``, and each must
    give the same result to within its own accuracy (the choice is only about cost).

    Eager: ``value`` (a 0-d array) is read to the host and one branch runs. Under ``jax.jit``:
    ``lax.switch`` on the traced index, so only the chosen branch runs, without a host read. Under
    ``torch.compile``, which has no multi-way conditional: the last branch (the general one).
    """
    if not is_traced(value):
        v = float(value)
        for threshold, branch in zip(thresholds, branches, strict=False):
            if v <= threshold:  # False for NaN
                return branch(operand)
        return branches[-1](operand)
    if is_jax(xp):
        import jax

        # the number of (ascending) thresholds below the value; a NaN value takes the last branch
        above = [xp.astype(value > t, xp.int32) for t in thresholds]
        nan = xp.astype(xp.isnan(value), xp.int32) * len(thresholds)
        index = xp.minimum(sum(above) + nan, len(thresholds))
        return jax.lax.switch(index, branches, operand)
    return branches[-1](operand)


def static_loop(body: Callable[[int, Any], Any], carry: Any, n: int, xp: Namespace) -> Any:
    """Apply ``body(k, carry)`` for k = 0, 1, …, n − 1 (``n`` a Python int): ``lax.fori_loop`` on JAX,
    so a jitted program holds one copy of ``body`` instead of ``n``; a Python loop elsewhere."""
    if is_jax(xp):
        import jax

        return jax.lax.fori_loop(0, n, body, carry)
    for k in range(n):
        carry = body(k, carry)
    return carry


def fori_loop(body: Callable[[int, Any], Any], carry: Any, counts: Array, max_count: int, xp: Namespace) -> Any:
    """Apply ``body(k, carry)`` for k = 0, 1, …, max(counts) − 1 (at most ``max_count`` times).

    ``counts`` holds a per-batch-element iteration count; ``body`` masks the elements that are done
    (``counts > k``). On JAX the loop is ``lax.fori_loop`` with a traced trip count, so it compiles
    under ``jax.jit`` (it is then forward-mode differentiable only); under ``torch.compile`` it is
    torch's ``while_loop`` higher-order operator, so the graph does not break. On eager backends the
    trip count is read to the host once (a single scalar, no array transfer) so no iteration is
    wasted; this is the one host synchronisation of an eager retraction (free on a CPU, a stream
    synchronisation on CUDA: compile the step there). Elements needing more than ``max_count``
    iterations are the caller's to flag.
    """
    if is_jax(xp):
        import jax

        n = xp.astype(xp.clip(xp.max(counts), 0, max_count), xp.int32)
        return jax.lax.fori_loop(0, n, body, carry)
    if is_torch(xp) and is_compiling():
        # torch.compile: a while_loop higher-order op with a traced trip count, so the graph does not
        # break at a host read (the eager path below reads the count once)
        import torch
        from torch._higher_order_ops.while_loop import while_loop

        single = not isinstance(carry, tuple)
        n = torch.clamp(torch.max(counts), 0, max_count).to(torch.int64)
        k0 = torch.zeros((), dtype=torch.int64, device=n.device)

        def step(k, *c):
            out = body(k, c[0] if single else tuple(c))
            return (k + 1, *((out,) if single else out))

        out = while_loop(lambda k, *c: k < n, step, (k0, *((carry,) if single else carry)))
        return out[1] if single else tuple(out[1:])
    n = max(0, min(int(xp.max(counts)), max_count))
    for k in range(n):
        carry = body(k, carry)
    return carry


# --------------------------------------------------------------------------------------------
# Fast paths
# --------------------------------------------------------------------------------------------


class _FastPath(NamedTuple):
    fn: Callable[..., Any]
    auto: bool


_FAST_PATHS: dict[tuple[str, str], _FastPath] = {}
_IMPLS = ("auto", "generic", "native")


def register_fast_path(
    op: str, backend: str, *, auto: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the native implementation of ``op`` on ``backend``.

    The function receives the same arguments as the generic implementation and may return
    ``NotImplemented`` to decline (e.g. when an optional dependency such as SciPy is missing).
    ``auto=False`` keeps it opt-in (``impl="native"``): used when the generic path is measurably
    more accurate and the native one is not much faster.
    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        _FAST_PATHS[(op, backend)] = _FastPath(fn, auto)
        return fn

    return decorator


def fast_path(op: str, xp: Namespace, impl: str = "auto") -> Callable[..., Any] | None:
    """The native implementation of ``op`` for ``xp`` that ``impl`` selects, or ``None``.

    ``impl="auto"``: the registered native path if it is marked for automatic use;
    ``"generic"``: none; ``"native"``: the registered one, or ``ValueError`` if the backend has none.
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "generic":
        return None
    entry = _FAST_PATHS.get((op, backend_name(xp)))
    if impl == "native":
        if entry is None:
            raise ValueError(
                f"impl='native': the {backend_name(xp)} backend has no native {op}; "
                f"backends with one: {', '.join(fast_path_backends(op)) or 'none'}"
            )
        return entry.fn
    return entry.fn if entry is not None and entry.auto else None


def fast_path_backends(op: str) -> list[str]:
    """Backends that have a native implementation of ``op`` (for tests and docs)."""
    return sorted(b for (o, b) in _FAST_PATHS if o == op)


# expm --------------------------------------------------------------------------------------
# Opt-in only: against exact references the generic degree-13 Padé path of geoarray.linalg.expm
# stays below 3e-14 relative error up to ‖A‖ = 1e3, while (float64, 16×16, measured 2026-11)
# scipy.linalg.expm reaches 3e-12, torch.linalg.matrix_exp 1.7e-13 and jax.scipy.linalg.expm
# 1.6e-13; the generic path costs 1.3-1.6× torch's native time and beats SciPy's.


@register_fast_path("expm", "torch", auto=False)
def _expm_torch(A: Array) -> Array:
    import torch

    return torch.linalg.matrix_exp(A)


@register_fast_path("expm", "jax", auto=False)
def _expm_jax(A: Array) -> Array:
    import jax.scipy.linalg as jsl

    return jsl.expm(A)


@register_fast_path("expm", "numpy", auto=False)
def _expm_numpy(A: Array) -> Array:
    try:
        import scipy.linalg as sla
    except ImportError:  # SciPy is optional; the generic Padé path takes over
        return NotImplemented
    return sla.expm(A)


# inverse of an upper-triangular matrix ---------------------------------------------------------
# The array API has no triangular solve. Without a native one, the compact-WY T factor comes from a
# terminating Neumann series (linalg._t_factor_series) and other callers use a general LU solve against I.
# The native ones use the triangular solver (torch, 4096×128's T factor: 0.14 ms instead of 0.44 ms for
# the LU solve); on torch the series is slower (336 × 7×7: 0.85 ms against 0.40 ms: small bmm are slow).


@register_fast_path("triu_inverse", "torch")
def _triu_inverse_torch(U: Array) -> Array:
    import torch

    eye = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device).expand(U.shape)
    return torch.linalg.solve_triangular(U, eye, upper=True)


@register_fast_path("triu_inverse", "jax")
def _triu_inverse_jax(U: Array) -> Array:
    import jax
    import jax.numpy as jnp

    eye = jnp.broadcast_to(jnp.eye(U.shape[-1], dtype=U.dtype), U.shape)
    return jax.lax.linalg.triangular_solve(U, eye, left_side=True, lower=False)


# C + α·A@B ---------------------------------------------------------------------------------------
# torch's addmm/baddbmm add the product into C inside the GEMM (β = 1): one N×n pass and one
# temporary fewer than A@B followed by an addition (one thread, float32: 4096×128·128×128 with the
# subtraction 1.51 ms → 1.45 ms, 1024×64·64×64 101 µs → 94 µs).
# NumPy exposes no GEMM with β, and XLA fuses the addition by itself.


@register_fast_path("addmm", "torch")
def _addmm_torch(C: Array, A: Array, B: Array, alpha: float) -> Array:
    import torch

    if C.ndim == A.ndim == B.ndim == 2:
        return torch.addmm(C, A, B, alpha=alpha)
    # torch.broadcast_shapes is Python (15–35 µs a call): the common equal-batch case first
    batch = A.shape[:-2] if A.shape[:-2] == B.shape[:-2] else torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    shape = (*batch, A.shape[-2], B.shape[-1])
    if tuple(C.shape) != shape or not batch:
        return NotImplemented
    size = math.prod(batch)  # not -1: a dimension of size 0 would leave it ambiguous
    A3 = A.expand(*batch, *A.shape[-2:]).reshape(size, *A.shape[-2:])
    B3 = B.expand(*batch, *B.shape[-2:]).reshape(size, *B.shape[-2:])
    return torch.baddbmm(C.reshape(size, *shape[-2:]), A3, B3, alpha=alpha).reshape(shape)


def addmm(C: Array, A: Array, B: Array, xp: Namespace, *, alpha: float = 1.0) -> Array:
    """C + α·(A @ B), with the addition inside the GEMM where the backend has one (torch).

    ``C`` has the shape of the (broadcast) product; ``alpha`` is a Python float.
    """
    native = fast_path("addmm", xp)
    if native is not None:
        out = native(C, A, B, alpha)
        if out is not NotImplemented:
            return out
    if alpha == 1.0:
        return C + A @ B
    if alpha == -1.0:
        return C - A @ B
    return C + alpha * (A @ B)


# A @ B for batches of small tall products -------------------------------------------------------
# torch's CPU bmm makes one GEMM call per matrix, and for a tall (m ≫ n) small product that call is
# several times slower than the transposed one (Bᵀ Aᵀ, whose long dimension is the output's columns):
# (336, 42, 7) @ (336, 7, 7) float32 takes 276 µs, (Bᵀ Aᵀ)ᵀ on strided views 84 µs, the ViT step's
# (336, 14, 14) @ (336, 14, 7) 148 µs and 69 µs. Single 2-D products and wide or square ones gain
# nothing (4096×128·128×128: 1.40 ms and 1.54 ms), so only batched tall small ones take this path, and
# only on the CPU (measured there; cuBLAS takes transposed operands as flags).


@register_fast_path("matmul", "torch")
def _matmul_torch(A: Array, B: Array) -> Array:
    if A.ndim < 3 or B.ndim < 2 or B.shape[-1] > 32 or A.shape[-2] < 2 * B.shape[-1] or A.device.type != "cpu":
        return A @ B
    return (B.mT @ A.mT).mT


def matmul(A: Array, B: Array, xp: Namespace) -> Array:
    """A @ B, for a batch of small tall products computed as (Bᵀ Aᵀ)ᵀ where that is faster (torch: the
    result is a transposed view)."""
    native = fast_path("matmul", xp)
    return A @ B if native is None else native(A, B)


# Consecutive pieces of a vector ---------------------------------------------------------------------
# torch.split returns all the views in one call (the optimizers unpack a raveled group of many
# Euclidean leaves at every step: 17 slices cost about twice as much).


@register_fast_path("split", "torch")
def _split_torch(x: Array, sizes: list[int]) -> list:
    import torch

    return list(torch.split(x, sizes))


def split(x: Array, sizes: list[int], xp: Namespace) -> list:
    """The consecutive pieces of the 1-d array ``x`` of lengths ``sizes`` (which sum to its length)."""
    native = fast_path("split", xp)
    if native is not None:
        return native(x, sizes)
    out, offset = [], 0
    for size in sizes:
        out.append(x[offset : offset + size])
        offset += size
    return out


# The identity ---------------------------------------------------------------------------------------
# torch.eye is one operation; array_api_compat's eye for torch is three (zeros, diagonal, fill_), and a
# step builds a few identities.


@register_fast_path("eye", "torch")
def _eye_torch(n: int, m: int | None, like: Array) -> Array:
    import torch

    return torch.eye(n, n if m is None else m, dtype=like.dtype, device=like.device)


def eye(n: int, m: int | None, like: Array, xp: Namespace) -> Array:
    """The n×m identity with the dtype and device of ``like``."""
    native = fast_path("eye", xp)
    if native is not None:
        return native(n, m, like)
    return xp.eye(n, m, dtype=like.dtype, device=device(like))


# a + w·(b − a) -----------------------------------------------------------------------------------
# torch.lerp is one pass and one temporary instead of three (sub, mul, add); on a 4096×128 momentum
# buffer the EMA and Nesterov updates of Muon take two passes instead of five. It is also the form
# torch.optim.Muon uses (buf.lerp_(g, 1 − μ), g.lerp(buf, μ)).


@register_fast_path("lerp", "torch")
def _lerp_torch(a: Array, b: Array, weight: Any) -> Array:
    import torch

    if a.shape != b.shape:
        return NotImplemented
    return torch.lerp(a, b, weight)


def lerp(a: Array, b: Array, weight: Any, xp: Namespace) -> Array:
    """a + weight·(b − a) for a Python float or 0-d array ``weight`` of a's dtype (one fused pass where
    the backend has it: torch)."""
    native = fast_path("lerp", xp)
    if native is not None:
        out = native(a, b, weight)
        if out is not NotImplemented:
            return out
    return a + weight * (b - a)


# ‖X‖₁ = max_j Σᵢ |xᵢⱼ| per matrix -----------------------------------------------------------------
# NumPy reduces a short axis slowly (one inner loop per output: 96 × 8×8 takes 18 µs); as a product
# with a row of ones the column sums are one batched matmul (7 µs).


@register_fast_path("norm1", "numpy")
def _norm1_numpy(X: Array) -> Array:
    ones = np.ones((1, X.shape[-2]), dtype=X.dtype)
    return np.max(ones @ np.abs(X), axis=(-2, -1))


def norm1(X: Array, xp: Namespace) -> Array:
    """The matrix 1-norm (largest absolute column sum) of each matrix of X (..., m, k); NaN propagates."""
    native = fast_path("norm1", xp)
    if native is not None and X.shape[-2] > 0 and X.shape[-1] > 0:
        return native(X)
    return xp.max(xp.sum(xp.abs(X), axis=-2), axis=-1)


# Householder QR (LAPACK geqrf convention: H_k = I - tau_k v_k v_kᵀ, v_k[k] = 1) ----------------
# Each returns (V, tau, R) with V unit lower trapezoidal (..., N, n), tau (..., n), R (..., n, n).


def _split_geqrf(a: Array, tau: Array, xp: Namespace, *, column_major: bool = True) -> tuple[Array, Array, Array]:
    # only the top n×n block of the packed factor holds R and the reflectors' unit diagonal; the rows
    # below are the reflectors as they are (a tril/add over all N rows cost torch 1.7 ms on 4096×128)
    # LAPACK returns the factor column-major (torch's geqrf, NumPy's raw QR seen transposed): V is
    # assembled transposed, so the copy reads and writes contiguous rows, and comes out as a
    # column-major view, which the products take as it is (torch, 4096×128: 0.1 ms instead of the
    # 1.5 ms of a row-major concatenation)
    n = a.shape[-1]
    top = a[..., :n, :]
    V_top = xp.tril(top, k=-1) + xp.eye(n, dtype=a.dtype, device=_compat.device(a))
    if a.shape[-2] <= n:
        V = V_top
    elif column_major:
        mT = xp.matrix_transpose
        V = mT(xp.concat([mT(V_top), mT(a[..., n:, :])], axis=-1))
    else:  # XLA chooses layouts itself (the transposed assembly measured slower in a jitted step)
        V = xp.concat([V_top, a[..., n:, :]], axis=-2)
    return V, tau, xp.triu(top)


_TORCH_GEQRF_OP: Any = None


def torch_geqrf_op() -> Callable[..., Any]:
    """``torch.geqrf`` as a custom operator with a fake (shape-only) kernel: torch 2.13's geqrf has
    none, so without this wrapper torch.compile cannot trace an optimizer step and falls back to eager.
    Registered on the first eager call (an optimizer's ``init`` makes one), never while tracing."""
    global _TORCH_GEQRF_OP
    if _TORCH_GEQRF_OP is None:
        import torch

        @torch.library.custom_op("geoarray::geqrf", mutates_args=(), schema="(Tensor A) -> (Tensor, Tensor)")
        def geqrf(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a, tau = torch.geqrf(A)
            return a.contiguous(), tau  # row-major, as the fake kernel promises

        @geqrf.register_fake
        def _(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            k = min(A.shape[-2], A.shape[-1])
            return torch.empty_like(A, memory_format=torch.contiguous_format), A.new_empty((*A.shape[:-2], k))

        _TORCH_GEQRF_OP = geqrf
    return _TORCH_GEQRF_OP


def torch_packed_qr(A: Array) -> tuple[Array, Array]:
    """LAPACK's geqrf factor (R on and above the diagonal, reflectors below) and τ, unsplit (torch)."""
    import torch

    return torch.geqrf(A)


def torch_apply_packed_q(a: Array, tau: Array, X: Array, transpose: bool) -> Array:
    """Q X (or Qᵀ X) for the packed reflectors of :func:`torch_packed_qr`, by LAPACK's ormqr (torch);
    ``a`` and ``tau`` are broadcast to X's batch shape (ormqr does not broadcast)."""
    import torch

    batch = X.shape[:-2]
    if a.shape[:-2] != batch:
        a = a.expand(*batch, *a.shape[-2:])
        tau = tau.expand(*batch, tau.shape[-1])
    return torch.ormqr(a, tau, X, left=True, transpose=transpose)


@register_fast_path("geqrf", "torch")
def _geqrf_torch(A: Array) -> tuple[Array, Array, Array]:
    import torch

    if is_compiling():
        if _TORCH_GEQRF_OP is None:
            raise RuntimeError("call the optimizer's init (or any eager step) before compiling its update")
        a, tau = _TORCH_GEQRF_OP(A)
    else:
        torch_geqrf_op()  # register the traceable operator while eager
        a, tau = torch.geqrf(A)
    return _split_geqrf(a, tau, _compat.array_namespace(a))


@functools.cache
def _numpy_has_stacked_raw_qr() -> bool:
    return np.lib.NumpyVersion(np.__version__) >= "2.0.0"  # parsed once: a regex, 10 µs per step


@register_fast_path("geqrf", "numpy")
def _geqrf_numpy(A: Array) -> tuple[Array, Array, Array]:
    import numpy as np

    if A.ndim > 2 and not _numpy_has_stacked_raw_qr():
        return NotImplemented
    h, tau = np.linalg.qr(A, mode="raw")
    # raw mode returns the LAPACK (Fortran-order) factor transposed: swapped back it is column-major,
    # which _split_geqrf copies row by row
    a = np.swapaxes(h, -1, -2)
    return _split_geqrf(a, tau, _compat.array_namespace(a))


@register_fast_path("geqrf", "jax")
def _geqrf_jax(A: Array) -> tuple[Array, Array, Array]:
    # XLA's geqrf (LAPACK on CPU, cuSOLVER on GPU) through the public raw mode: the generic path unrolls
    # one Householder step per column into the traced program, which made jit compiles of an optimizer
    # step take tens of seconds
    import jax.numpy as jnp

    h, tau = jnp.linalg.qr(A, mode="raw")  # like NumPy: the LAPACK factor, transposed
    return _split_geqrf(jnp.swapaxes(h, -1, -2), tau, _compat.array_namespace(A), column_major=False)

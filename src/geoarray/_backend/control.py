"""Control flow that differs between backends: tracing, compilation, device-side selects and loops,
finiteness checks, and the static pytree nodes that optimizer states carry."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any

import optree

from .._typing import Array
from .namespace import device, is_compiling, is_jax, is_torch

Namespace = Any


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
    if is_jax(xp):  # one program (eager: isfinite and all would each compile for every new shape)
        return compiled(_all_of_isfinite, xp, "xp")(x, xp=xp)
    return _all_of_isfinite(x, xp)


def _all_of_isfinite(x: Array, xp: Namespace) -> Array:
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


# -- host reads ----------------------------------------------------------------------------------------
#
# A few decisions inside a step depend on values the step computes: whether the gradients are finite,
# which Taylor rule covers the retraction's norm, how many doublings the scaling needs. Eager code can
# read such a value to the host and do only the work it asks for; on an accelerator that read waits for
# every kernel queued before it (a stream synchronisation), and a CUDA graph cannot contain it. Without
# it the step does fixed work and decides on the device (a ``where``), as it does under ``jax.jit``.

HOST_READS = ("never", "cpu", "always")
_host_reads = ["cpu"]


def set_host_reads(policy: str) -> str:
    """Set where eager steps may read a computed value to the host to choose their work; returns the
    previous policy. ``"cpu"`` (the default): only for arrays in host memory (NumPy,
    array-api-strict, torch and JAX on the CPU), where a read is a load, not a synchronisation, and
    saves work; ``"never"``: nowhere, so a step does on the CPU exactly what it does on a GPU (for
    tests); ``"always"``: everywhere, accelerators included (the behaviour before the policy existed:
    one stream synchronisation per read).

    Without reads an optimizer step does fixed work: it is computed and masked (a skipped step costs a
    whole step), and the retraction runs a static budget of doublings
    (:data:`geoarray.manifolds.retraction.SYNC_FREE_DOUBLINGS`), so a step too large for it comes out
    non-finite and is skipped and counted in ``state.skipped`` like a non-finite gradient, without the
    warning (which would need a read). With reads, a step of any size is taken."""
    if policy not in HOST_READS:
        raise ValueError(f"host reads policy must be one of {', '.join(map(repr, HOST_READS))}, got {policy!r}")
    previous = _host_reads[0]
    _host_reads[0] = policy
    return previous


def get_host_reads() -> str:
    """The current host reads policy (:func:`set_host_reads`)."""
    return _host_reads[0]


def host_reads_allowed(x: Array) -> bool:
    """Whether eager code may read a value computed from ``x`` to the host (never while traced).

    Where it may, a step skips the work a value says it can skip (a non-finite step computes nothing,
    the retraction runs the cheapest Taylor rule and only the doublings it needs); where it may not,
    the same results come from fixed work masked on the device (to rounding: every route is accurate
    to unit roundoff)."""
    if is_traced(x):
        return False
    policy = _host_reads[0]
    if policy == "never":
        return False
    if policy == "always":
        return True
    return _in_host_memory(x)


def _in_host_memory(x: Array) -> bool:
    if type(x).__module__.startswith("jax"):
        return all(d.platform == "cpu" for d in x.devices())
    kind = getattr(device(x), "type", None)  # torch.device
    if kind is not None:
        return kind == "cpu"
    return not hasattr(x, "__cuda_array_interface__")  # NumPy, array-api-strict; CuPy lives on a GPU


def is_jax_tracer(x: Any) -> bool:
    """True for a tracer of ``jax.jit``/``vmap`` (which may carry no device); no import of JAX."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.core.Tracer)


def is_traced(x: Any) -> bool:
    """True inside ``jax.jit``/``vmap`` (x is a tracer) or while ``torch.compile`` traces: values cannot be
    read on the host there."""
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.core.Tracer):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _flat_tensors(tree: Any) -> bool:
    """Whether ``tree`` is a list or tuple of torch tensors (its own leaves), asked while torch.compile
    traces: there optree's functions are dynamo's Python polyfills, which traced ~300 instructions per
    call for a list that geoarray.torch hands the core as it is."""
    if type(tree) is not list and type(tree) is not tuple:
        return False
    torch = sys.modules["torch"]
    return all(isinstance(x, torch.Tensor) for x in tree)


def tree_leaves(tree: Any) -> list:
    """``optree.tree_leaves(tree)``; under ``torch.compile`` a list or tuple of tensors without optree."""
    if is_compiling() and _flat_tensors(tree):
        return list(tree)
    return optree.tree_leaves(tree)


def like_tree(tree: Any, leaves: list) -> Any:
    """``leaves`` in the tree structure of ``tree`` (``optree.tree_unflatten(optree.tree_structure(tree),
    leaves)``); under ``torch.compile`` a list or tuple of tensors without optree."""
    if is_compiling() and _flat_tensors(tree):
        return type(tree)(leaves)
    return optree.tree_unflatten(optree.tree_structure(tree), leaves)


def ordered_after(values: Any, previous: Any) -> Any:
    """``values`` (a pytree of arrays), usable only once ``previous`` (a pytree of arrays, or None) is
    computed: traced by JAX, the first leaf of ``values`` gets a data dependency on one entry of every
    array of ``previous`` (it is added as 0·s, s made finite: the values are unchanged, except that a
    −0.0 entry becomes +0.0), so that XLA runs the work on ``values`` after the work that made
    ``previous`` instead of beside it. Elsewhere ``values`` unchanged (eager operations and
    ``torch.compile``'s kernels run in program order).

    Why: jaxlib's batched LAPACK kernels on the CPU (``geqrf``, the triangular solve, LU) split their
    batch over XLA's intra-op thread pool and block until it is done; two started at once, one on each
    pool thread, wait for each other for ever (jaxlib 0.10.2 on two cores: a jitted Adam step on two
    Stiefel groups, 36 × St(768, 64) and 36 × St(512, 64), hung in 4 of 5 runs; with its sections and
    retractions ordered by this, 12 of 12 finished; the eager step, which this leaves alone, 4 of 4). An
    ``optimization_barrier`` does not do it: XLA turns it into control dependencies, which its CPU runtime
    does not order thunks by (tests/test_jax_lapack_order.py)."""
    jax = sys.modules.get("jax")
    # nothing to order without JAX, or while torch.compile traces (whose optree polyfill made the tree walk
    # below ~250 traced instructions per call, twice per group and step)
    if previous is None or jax is None or is_compiling():
        return values
    leaves = optree.tree_leaves(values)
    if not leaves or not isinstance(leaves[0], jax.core.Tracer):
        return values
    before = [x for x in optree.tree_leaves(previous) if isinstance(x, jax.Array) and x.size]
    if not before:
        return values
    # XLA cannot fold 0·s away (0·x is not 0 for a float it cannot see is finite)
    jnp = sys.modules["jax.numpy"]
    s = sum(jnp.reshape(x, (-1,))[0].astype(jnp.float32) for x in before)  # one entry of each: all computed
    zero = 0 * jnp.where(jnp.isfinite(s), s, 0)
    first, *rest = leaves
    spec = optree.tree_structure(values)
    return optree.tree_unflatten(spec, [first + zero.astype(first.dtype), *rest])


def ordering_token(value: Any, latest: Any, xp: Any) -> Any:
    """What the next :func:`ordered_after` orders after, once ``value`` is computed: ``value`` on JAX when it
    holds arrays, else ``latest`` unchanged. Only JAX's traces are ordered; elsewhere the tree walk is
    skipped (under ``torch.compile`` optree's polyfill costs ~250 traced instructions per call)."""
    if not is_jax(xp):
        return latest
    return value if optree.tree_leaves(value) else latest


def computed_once(x: Array) -> Array:
    """``x`` itself; under ``torch.compile``, a floating ``x`` kept as a stored value that the loops reading
    it load.

    Inductor inlines a small pointwise result into every fused loop that reads it and evaluates it
    again per vector there: Adam's bias corrections (1 − β)/(1 − βᵗ), two ``pow`` per 16 entries of each
    moment, and the signs S = sign(diag R) of a Householder section, a strided gather and a NaN test per
    row of each application. On the CPU that made the loop holding Adam's moments of the paper's ViT
    weights take 0.71–0.76 ms instead of 0.32–0.36 ms (inductor's kernel profile, two runs each). Inductor
    (torch 2.13) keeps a scan as a loop of its own, and a cumulative sum over an axis of length 1 is the
    identity, exactly.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or not is_compiling():
        return x  # (an integer cumsum would come back as int64)
    return torch.cumsum(x[..., None], dim=-1)[..., 0]


# -- static pytree nodes ----------------------------------------------------------------------------
#
# Optimizer states carry what ``update`` needs besides arrays (the layout of the parameter tree: its
# paths, groups and manifolds), so that an optimizer object holds configuration only. Such a node must
# flatten to no leaves in every pytree registry a state meets — optree (the library's), jax.tree_util
# (jax.jit, optax) and torch.utils._pytree — and come back as the same object: its value is static
# (hashable, compared by ``==``, part of the tree structure, so jax.jit specialises on it).

_STATIC_NODES: list[type] = []
_STATIC_REGISTERED: dict[str, set[type]] = {"jax": set(), "torch": set()}


# optree's signatures expect a node to be a Collection of its children and to differ from its metadata;
# a static node is neither (no children, and it is its own metadata)
def _flatten_static(node: Any) -> tuple[tuple[()], Any, tuple[()]]:
    return (), node, ()


def _unflatten_static(node: Any, children: Any) -> Any:
    return node


def register_static_node(cls: type) -> type:
    """Class decorator: instances of ``cls`` are pytree nodes with no children whose value is static.

    Registered with optree at once and with ``jax.tree_util`` / ``torch.utils._pytree`` by
    :func:`ensure_static_nodes` (called by the optimizers' ``init`` and by ``geoarray.jax`` /
    ``geoarray.torch`` on import), so importing geoarray imports neither framework.
    """
    optree.register_pytree_node(
        cls,
        _flatten_static,
        _unflatten_static,
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

    Eager where host reads are allowed (:func:`host_reads_allowed`): ``value`` (a 0-d array) is read
    to the host and one branch runs. On JAX otherwise (eager or under ``jax.jit``): ``lax.switch`` on
    the index computed on the device, so only the chosen branch runs, without a host read. Elsewhere
    (eager torch or CuPy without host reads, ``torch.compile``, which has no multi-way conditional):
    the last branch (the general one).

    On JAX, call it inside a compiled kernel (:func:`compiled`): an eager ``lax.switch`` over branches
    that are new closures at every call is traced and compiled again at every call (~0.25 s each).
    """
    if host_reads_allowed(value):
        # the value only chooses a route (not differentiated): a torch tensor that requires grad is read
        # through detach(), without torch's warning about converting one to a scalar
        v = float(value.detach() if getattr(value, "requires_grad", False) else value)
        for threshold, branch in zip(thresholds, branches, strict=False):
            if v <= threshold:  # False for NaN
                return branch(operand)
        return branches[-1](operand)
    if selects_on_device(xp):
        import jax

        # the number of (ascending) thresholds below the value; a NaN value takes the last branch
        above = [xp.astype(value > t, xp.int32) for t in thresholds]
        nan = xp.astype(xp.isnan(value), xp.int32) * len(thresholds)
        index = xp.minimum(sum(above) + nan, len(thresholds))
        return jax.lax.switch(index, branches, operand)
    return branches[-1](operand)


def selects_on_device(xp: Namespace) -> bool:
    """Whether :func:`select` chooses its branch on the device, without a host read, eager or compiled
    (JAX: ``lax.switch``). Where it does not (eager torch or CuPy without host reads, ``torch.compile``)
    it runs the general branch, and a caller that knows a bound on the host can do better by choosing a
    fixed route itself (the retraction's ``static_bound``); where it does, such a route is not needed."""
    return is_jax(xp)


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
    synchronisation on CUDA). Where host reads are not allowed (:func:`host_reads_allowed`), eager
    torch and CuPy run all ``max_count`` iterations (a static count: pass a small budget). Elements
    needing more than ``max_count`` iterations are the caller's to flag.
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
    n = max(0, min(int(xp.max(counts)), max_count)) if host_reads_allowed(counts) else max_count
    for k in range(n):
        carry = body(k, carry)
    return carry

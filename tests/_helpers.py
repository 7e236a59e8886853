"""Shared test helpers: backend loading, host conversion and a namespace-aware assert_close."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_extra.testing import assert_close as _xpx_assert_close

import geoarray
from geoarray import _backend
from geoarray._backend import array_namespace, backend_name

BACKENDS = ("numpy", "array-api-strict", "torch", "jax", "cupy", "torch-cuda", "jax-cuda")


@dataclass(frozen=True)
class Backend:
    name: str
    xp: Any
    device: Any
    skip: str | None = None

    @property
    def kind(self) -> str:
        """The library behind the backend: numpy, array_api_strict, torch, jax or cupy."""
        return {"array-api-strict": "array_api_strict", "torch-cuda": "torch", "jax-cuda": "jax"}.get(
            self.name, self.name
        )


def load_backend(name: str) -> Backend:
    if name == "numpy":
        import array_api_compat.numpy as xp

        return Backend(name, xp, "cpu")
    if name == "array-api-strict":
        import array_api_strict as xp

        # not the default device: a creation call that forgets device= (its array lands on CPU_DEVICE and
        # cannot be combined with the inputs) and an implicit conversion to NumPy (refused off the CPU)
        # fail here as they would on a GPU
        return Backend(name, xp, xp.Device("device1"))
    if name in ("torch", "torch-cuda"):
        import array_api_compat.torch as xp
        import torch

        torch.set_default_dtype(torch.float64)
        # the suite works on small matrices: intra-op threads only add OpenMP wake-ups, which cost
        # ~1 ms per op when the cores are busy (measured: torch.triu of a 10×3 tensor, 1 ms vs 1 µs)
        torch.set_num_threads(1)
        if name == "torch-cuda":
            if not torch.cuda.is_available():
                return Backend(name, xp, None, "torch-cuda: no CUDA GPU visible to torch")
            # the float32 tolerances assume IEEE float32 products; TF32 keeps 10 mantissa bits (torch's
            # default for matrix products is full float32 already, for cuDNN it is TF32)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            # the index spelled out: tensors report cuda:0, and torch.device("cuda") != torch.device("cuda", 0)
            return Backend(name, xp, torch.device("cuda", torch.cuda.current_device()))
        return Backend(name, xp, torch.device("cpu"))
    if name in ("jax", "jax-cuda"):
        if name == "jax":
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax

        jax.config.update("jax_enable_x64", True)
        # float32 products in full float32: JAX's default precision on Ampere and later GPUs is TF32
        # (10 mantissa bits), which the float32 tolerances of the suite do not allow for
        jax.config.update("jax_default_matmul_precision", "highest")
        import jax.numpy as xp
        from _jax_lowering import share_mlir_contexts

        share_mlir_contexts()
        platform = "gpu" if name == "jax-cuda" else "cpu"
        try:
            dev = jax.devices(platform)[0]
        except RuntimeError as exc:
            return Backend(name, xp, None, f"{name}: no JAX {platform} device ({exc})".splitlines()[0])
        return Backend(name, xp, dev)
    if name == "cupy":
        try:
            import array_api_compat.cupy as xp
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no device")
        except Exception as exc:  # ImportError, CUDARuntimeError
            return Backend(name, None, None, f"cupy: no usable CUDA GPU ({type(exc).__name__})")
        return Backend(name, xp, cupy.cuda.Device(0))
    raise ValueError(f"unknown backend {name!r}; choose from {BACKENDS}")


def to_numpy(x: Any) -> np.ndarray:
    """Copy an array of any backend to a NumPy array (test-side only)."""
    if isinstance(x, (np.ndarray, np.generic)):  # NumPy turns 0-d results into scalars
        return np.asarray(x)
    xp = array_namespace(x)
    if _backend.is_cupy(xp):
        return x.get()
    if _backend.is_torch(xp):
        return x.detach().cpu().numpy()
    if _backend.is_jax(xp):
        return np.asarray(x)
    return np.from_dlpack(x)


def asarray(x: Any, xp: Any, device: Any, dtype: Any = None) -> Any:
    """A NumPy (or nested list) value as an array of the backend under test (float64 by default)."""
    return _backend.from_host(np.asarray(x), xp, geoarray.resolve_dtype(xp, dtype, device), device)


def assert_close(
    actual: Any,
    desired: Any,
    *,
    xp: Any,
    rtol: float = 0.0,
    atol: float = 0.0,
    device: Any = None,
    dtype: Any = None,
    err_msg: str = "",
) -> None:
    """Values, namespace, shape, dtype and device of ``actual`` against ``desired``.

    ``desired`` may be an array of ``xp`` (its dtype and device are then the expected ones) or a
    NumPy reference (e.g. from SciPy), which is moved to ``xp`` with the expected ``dtype``
    (default: the backend's default float, i.e. float64) and ``device``; the namespace, shape,
    dtype and device checks of ``array_api_extra.testing.assert_close`` then apply to ``actual``.
    """
    actual_ns = array_namespace(actual)
    assert backend_name(actual_ns) == backend_name(xp), (
        f"result lives in {backend_name(actual_ns)}, expected {backend_name(xp)}"
    )
    if isinstance(desired, np.ndarray):
        desired = np.array(desired)  # a writeable copy (torch warns on read-only NumPy views)
        # on the expected device, or on actual's: a reference computed on the host is compared where the
        # result lives (a GPU result against a CPU array would fail on the device check alone)
        where = _backend.device(actual) if device is None else device
        desired = _backend.from_host(desired, xp, geoarray.resolve_dtype(xp, dtype, where), where)
    elif dtype is not None:
        assert actual.dtype == dtype, f"result has dtype {actual.dtype}, expected {dtype}"
    if device is not None:
        assert _backend.device(actual) == device, f"result on {_backend.device(actual)}, expected {device}"
    _xpx_assert_close(actual, desired, rtol=rtol, atol=atol, xp=xp, err_msg=err_msg)


def max_abs(x: Any) -> float:
    return float(np.max(np.abs(to_numpy(x)))) if np.size(to_numpy(x)) else 0.0


# Relative tolerance of two *different* computations of one quantity, per dtype: a few units in the
# last place, times the growth of rounding over a handful of optimizer steps. Two code paths (a
# batched and an unbatched product, an autograd wrapper and a direct call, a fused multiply-add where
# the other path rounds twice) round differently on CPUs with and without AVX-512, so they are never
# compared bit for bit; bit-equality is kept for the same computation repeated (resume, copies, replicas).
AGREE_RTOL = {"float64": 1e-12, "float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}


def assert_agree(actual: Any, desired: Any, *, rtol: float | None = None, what: str = "") -> None:
    """Two different computations of the same array agree: max|a − b| ≤ rtol·max(1, max|b|).

    ``rtol`` defaults to :data:`AGREE_RTOL` for ``desired``'s dtype. Shapes and dtypes must be equal.
    """
    dt_a, dt_b = (
        str(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype).rsplit(".", 1)[-1] for x in (actual, desired)
    )
    assert dt_a == dt_b, f"{what}: dtype {dt_a}, expected {dt_b}"
    if rtol is None:
        rtol = AGREE_RTOL[dt_b]

    def host(x: Any) -> np.ndarray:
        if dt_b in ("float16", "bfloat16") and not isinstance(x, np.ndarray):  # NumPy has no bfloat16
            x = array_namespace(x).astype(x, array_namespace(x).float32)
        return to_numpy(x).astype(np.float64)

    a64, b64 = host(actual), host(desired)
    assert a64.shape == b64.shape, f"{what}: shape {a64.shape}, expected {b64.shape}"
    scale = max(1.0, float(np.max(np.abs(b64)))) if b64.size else 1.0
    err = float(np.max(np.abs(a64 - b64))) if b64.size else 0.0
    assert err <= rtol * scale, f"{what}: max|a - b| = {err:.3e} > {rtol:.1e} x {scale:.3g}"


# -- host reads (#30) ------------------------------------------------------------------------------
# Counted on torch with a dispatch mode (tests/test_host_reads.py's docstring says what each name is).
READS = {"_local_scalar_dense", "item", "is_nonzero"}
# operations after which the host waits for a GPU although nothing is read on the CPU: an array made from
# host data (torch copies it to a CUDA device synchronously, pytorch/pytorch#120996) and an output whose
# shape depends on the data (the host waits for the count), boolean-mask indexing included
WAITS = {"lift_fresh", "lift_fresh_copy", "nonzero", "masked_select", "masked_scatter"}
# and torch's linear algebra that checks LAPACK's/cuSOLVER's ``info`` on the host: linalg.solve, inv and
# cholesky end in ``_linalg_check_errors`` (their ``_ex`` forms do not); eigh and svd check inside their
# kernels, with no unchecked form, so they are counted themselves
WAITS |= {"_linalg_check_errors", "_linalg_eigh", "_linalg_svd"}


def _boolean_index(args) -> bool:
    import torch

    return any(
        isinstance(a, (list, tuple)) and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in a)
        for a in args
    )


def host_waits(fn):
    """(names, result) of ``fn()``: the torch operations in it that make the host wait for a GPU, run on
    any device: reads to the host (``READS``), arrays made from host data and data-dependent shapes
    (``WAITS``, boolean-mask indexing included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name in READS or name in WAITS or (name.startswith("index") and _boolean_index(args)):
                seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Count():
        out = fn()
    return seen, out


def frames_tree(xp: Any, device: Any) -> tuple[dict, dict]:
    """A small tree that an optimizer's tests step: two stacked Stiefel(9, 3) frames, a Grassmann(7, 2) point and
    a Euclidean (4, 3) matrix (float64); returns ``(params, manifolds)``."""
    from geoarray.manifolds import Grassmann, Stiefel

    S, G = Stiefel(9, 3), Grassmann(7, 2)
    params = {
        "frames": S.random(0, xp=xp, batch_shape=(2,), device=device),
        "subspace": G.random(1, xp=xp, device=device),
        "w": geoarray.random.normal(2, (4, 3), xp=xp, device=device),
    }
    return params, {"frames": S, "subspace": G, "w": None}


def random_like(params: Any, seed: int) -> Any:
    """A tree like ``params`` of standard normal arrays (each leaf its own seed from ``seed``): a gradient."""
    import optree

    leaves, spec = optree.tree_flatten(params)
    xp = array_namespace(*leaves)
    out = [
        geoarray.random.normal(seed + i, tuple(x.shape), xp=xp, dtype=x.dtype, device=_backend.device(x))
        for i, x in enumerate(leaves)
    ]
    return optree.tree_unflatten(spec, out)


def assert_trees_agree(got: Any, want: Any) -> None:
    """Every floating leaf of ``got`` agrees with ``want``'s to AGREE_RTOL; integer leaves (counters) are equal."""
    import optree

    for a, b in zip(optree.tree_leaves(got), optree.tree_leaves(want), strict=True):
        if np.issubdtype(to_numpy(b).dtype, np.integer):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
        else:
            assert_agree(a, b)

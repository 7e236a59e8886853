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

The package has one module per kind of fact: :mod:`.namespace` (namespaces, devices, dtype policy),
:mod:`.control` (tracing, compilation, device-side selects and loops, static pytree nodes),
:mod:`.autodiff` (gradients and Jacobians through torch.func or JAX) and :mod:`.kernels` (native
fast paths). Everything is re-exported here: library code calls ``_backend.name``.

Heavy backends (torch, jax, cupy) are never imported here; their presence is read off
``sys.modules`` or off the arrays the user passes in.
"""

from __future__ import annotations

from .autodiff import (
    has_autodiff,
    jacfwd,
    jit_with_fallback,
    value_and_grad,
    vmap_compiled,
)
from .control import (  # noqa: F401
    HOST_READS,
    _jax_jit,
    all_finite,
    all_finite_on_host,
    compiled,
    computed_once,
    ensure_static_nodes,
    fori_loop,
    get_host_reads,
    host_reads_allowed,
    is_compiling,
    is_traced,
    register_static_node,
    select,
    selects_on_device,
    set_host_reads,
    static_loop,
)
from .kernels import (
    addmm,
    clip,
    eye,
    fast_path,
    fast_path_backends,
    host_constant,
    householder_section_form,
    inv,
    lerp,
    matmul,
    norm1,
    register_fast_path,
    sign,
    skew_square_minus_gram,
    solve,
    split,
    t_factor,
    torch_apply_packed_q,
    torch_geqrf_op,
    torch_packed_ops,
    torch_packed_qr,
)
from .namespace import (  # noqa: F401
    _BACKEND_NAMES,
    _backend_name,
    _float64_missing_message,
    array_namespace,
    as_array,
    as_namespace,
    backend_name,
    check_real_floating,
    commit_to,
    default_float,
    device,
    dtype_name,
    from_host,
    from_host_like,
    host_seed,
    index_dtype,
    is_array_api_strict,
    is_cupy,
    is_jax,
    is_numpy,
    is_torch,
    resolve_dtype,
    to_host,
    writable,
)

__all__ = [
    "addmm",
    "all_finite",
    "all_finite_on_host",
    "array_namespace",
    "as_array",
    "as_namespace",
    "backend_name",
    "check_real_floating",
    "clip",
    "commit_to",
    "compiled",
    "computed_once",
    "default_float",
    "device",
    "dtype_name",
    "ensure_static_nodes",
    "eye",
    "fast_path",
    "fast_path_backends",
    "fori_loop",
    "from_host",
    "from_host_like",
    "get_host_reads",
    "has_autodiff",
    "host_constant",
    "host_reads_allowed",
    "host_seed",
    "householder_section_form",
    "index_dtype",
    "inv",
    "is_array_api_strict",
    "is_compiling",
    "is_cupy",
    "is_jax",
    "is_numpy",
    "is_torch",
    "is_traced",
    "jacfwd",
    "jit_with_fallback",
    "lerp",
    "matmul",
    "norm1",
    "register_fast_path",
    "register_static_node",
    "resolve_dtype",
    "select",
    "selects_on_device",
    "set_host_reads",
    "sign",
    "skew_square_minus_gram",
    "solve",
    "split",
    "static_loop",
    "t_factor",
    "to_host",
    "torch_apply_packed_q",
    "torch_geqrf_op",
    "torch_packed_ops",
    "torch_packed_qr",
    "value_and_grad",
    "vmap_compiled",
    "writable",
]

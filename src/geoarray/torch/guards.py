"""Fewer guards for a compiled step: :func:`skip_guards_on_library_globals`.

``torch.compile`` re-checks, before every call of a compiled function, each assumption it made while
tracing (its *guards*). Tracing an optimizer step reads several hundred module globals of geoarray and
of the libraries under it: each array-API wrapper of ``array_api_compat`` (its code object, defaults and
closure cells), geoarray's registries of namespaces and fast kernels, optree's and torch's pytree
registries. On the ViT weight set (336 × Stiefel(49, 7), torch 2.13, one CPU thread) 461 of a step's
604 guards are on globals (this filter keeps 180), and checking them all costs little in a tight loop
(22 µs) but 0.2–0.3 ms when the step runs between other work, as in training, with the guards' objects
out of cache: about a tenth of the step (``benchmarks/step_kernels.py --compile`` times both). On a
GPU, where a step is a few hundred microseconds of launches or one CUDA graph replay, the same checks
run on the host before every call.

These modules' globals do not change in a training loop: functions and constants are fixed at import,
and the registries among them only fill up (a namespace cached on first use, geoarray's LAPACK operators
registered by the first eager step, pytree node types), which leaves a traced step as correct as it
was. Their guards can be dropped::

    step = torch.compile(opt.update, fullgraph=True,
                         options={"guard_filter_fn": geoarray.torch.skip_guards_on_library_globals})

(``options=`` is ``torch.compile``'s documented way to filter guards; ``torch.compiler`` has coarser
filters, e.g. ``skip_guard_on_globals_unsafe``, which drops the guards on *every* global, your own
module's included.)

What is kept: every guard on the compiled function's arguments (tensor shapes, dtypes, strides and
devices; the state's layout; an optimizer's hyperparameters), torch's global state (grad mode, default
device, deterministic algorithms), and every guard on a global that is not one of the library modules
below: your own module's globals and closures stay guarded, so changing a global your compiled function
reads recompiles it as before. What is given up: reassigning an attribute of geoarray,
``array_api_compat``, ``array_api_extra``, optree, NumPy or torch after the first compiled call (for
example ``geoarray.manifolds.retraction.SYNC_FREE_DOUBLINGS``, or patching a torch function) goes
unnoticed by the compiled function; call ``torch._dynamo.reset()`` after such a change.
"""

from __future__ import annotations

import re
import types
from typing import Any

__all__ = ["LIBRARY_PACKAGES", "skip_guards_on_library_globals"]

#: The top-level packages whose module globals :func:`skip_guards_on_library_globals` does not guard.
LIBRARY_PACKAGES = frozenset({"geoarray", "array_api_compat", "array_api_extra", "optree", "numpy", "torch"})

# a guard's name starts from its root: G['name'] for a global (dynamo names an imported module's global
# G['__import_<module, dots spelled _dot_>'], the builtins G['__builtins_dict___<k>']), L['name'] for an
# argument; a global's name may be wrapped, as in list(dict.keys(G['...']...))[0]
_GLOBAL_ROOT = re.compile(r"G\['([^']+)'\]")


def _package_of(obj: Any) -> str | None:
    """The top-level package that defines ``obj`` (a module, class or function), else None."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        name = getattr(obj, "__module__", None) or ""
    else:
        return None
    return name.partition(".")[0] or None


def _library_root(root: str, roots: dict[str, Any]) -> bool:
    if root.startswith("__import_"):  # an imported module, named by dynamo
        return root[len("__import_") :].split("_dot_")[0] in LIBRARY_PACKAGES
    if root.startswith("__builtins_dict__"):
        return True
    # a global of the compiled function's own module: a library one only if it is a module, class or
    # function of a library package (a bound value, a float, a tensor, a closure scope stays guarded)
    return root in roots and _package_of(roots[root]) in LIBRARY_PACKAGES


def skip_guards_on_library_globals(guard_entries: list) -> list[bool]:
    """A ``guard_filter_fn`` for ``torch.compile``: keep every guard except those on the globals of
    geoarray and the libraries it runs on (:data:`LIBRARY_PACKAGES`), which do not change after import.

    ``guard_entries`` are torch's ``GuardFilterEntry`` records; returns one bool per entry, True to keep
    it. See the module docstring for what is kept and what is given up.
    """
    roots: dict[str, Any] = {}
    for entry in guard_entries:  # the global a name starts from, where a guard checks that global itself
        match = _GLOBAL_ROOT.fullmatch(entry.name)
        if entry.is_global and match is not None and entry.has_value:
            roots.setdefault(match.group(1), entry.value)
    keep = []
    for entry in guard_entries:
        match = _GLOBAL_ROOT.search(entry.name) if entry.is_global else None
        keep.append(match is None or not _library_root(match.group(1), roots))
    return keep

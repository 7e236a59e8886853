"""How the JAX test sessions lower programs to MLIR: in a shared context instead of a new one each time.

Much of a JAX test session's time is compiling the tests' small programs, mostly single eager operations
of a new shape (about 12,600 programs in the CPU session). JAX lowers each into a module of its own, new
MLIR context (``jax._src.interpreters.mlir.make_ir_context``), which loads and registers every dialect
again: 3–6 ms of the ~15 ms that one eager operation takes to trace, lower and compile here. The tests
reuse one context per thread for a bounded number of programs instead. The programs are the same (only
the context that owns their types and attributes is shared), so nothing that the tests check changes;
users' programs are unaffected. Renewing the context every ``PROGRAMS_PER_CONTEXT`` programs bounds the
memory that a context keeps for the types and constants of the modules lowered in it.

Written against JAX's internals, so it guards itself: where ``make_ir_context`` is gone, or is not a
function of no arguments, the tests run with JAX's own."""

from __future__ import annotations

import inspect
import threading
from typing import Any

PROGRAMS_PER_CONTEXT = 1000


def share_mlir_contexts() -> bool:
    """Route JAX's ``make_ir_context`` through a per-thread cache; True where it did (idempotent)."""
    try:
        from jax._src.interpreters import mlir
    except ImportError:
        return False
    make = getattr(mlir, "make_ir_context", None)
    if make is None or getattr(make, "shared_by_geoarray_tests", False):
        return make is not None
    try:
        if inspect.signature(make).parameters:
            return False
    except (TypeError, ValueError):
        return False
    local = threading.local()

    def shared() -> Any:
        if getattr(local, "uses", PROGRAMS_PER_CONTEXT) >= PROGRAMS_PER_CONTEXT:
            local.context, local.uses = make(), 0
        local.uses += 1
        return local.context

    shared.shared_by_geoarray_tests = True  # type: ignore[attr-defined]
    shared.jax_own = make  # type: ignore[attr-defined]
    mlir.make_ir_context = shared
    return True

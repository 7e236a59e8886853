"""How many programs a JAX test session compiles, and how long XLA takes: one line in the session's log.

Most of the JAX sessions' time is XLA compiling the tests' eager operations, one program per operation
and shape (2026-11-30, the CPU session: 12,716 compilations, 186.8 of ~400 worker-seconds; lowering to
MLIR 36.4 s). The count is the quantity to watch when a change makes the session slower or faster, and
pytest's slowest-test table cannot show it: it is spread over every test. JAX reports each compilation
through ``jax.monitoring``; :class:`CompileCounter` adds them up in each process, the pytest-xdist
workers hand their totals to the controller (``conftest.py``), and the terminal summary prints them.
A program served by JAX's persistent compilation cache (another worker compiled it) is not compiled
again and not counted.
"""

from __future__ import annotations

from typing import Any

#: jax.monitoring's duration events → the name of the total they add to
EVENTS = {
    "/jax/core/compile/backend_compile_duration": "compile",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
}


class CompileCounter:
    """A ``jax.monitoring`` duration listener that counts XLA compilations and lowerings and sums their
    seconds; :meth:`stop` unregisters it."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(EVENTS.values(), 0)
        self.seconds = dict.fromkeys(EVENTS.values(), 0.0)

    def __call__(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        name = EVENTS.get(event)
        if name is not None:
            self.counts[name] += 1
            self.seconds[name] += duration_secs

    def totals(self) -> dict[str, float]:
        """``{"compile": n, "compile_s": s, "lower": n, "lower_s": s}``: plain numbers (an xdist worker
        sends them to the controller)."""
        out: dict[str, float] = {}
        for name in EVENTS.values():
            out[name] = self.counts[name]
            out[f"{name}_s"] = self.seconds[name]
        return out

    def stop(self) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self)


def start() -> CompileCounter:
    """A new counter, registered with ``jax.monitoring``."""
    import jax.monitoring

    counter = CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(counter)
    return counter


def add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The sum of two :meth:`CompileCounter.totals` (of two processes)."""
    return {key: a.get(key, 0) + b.get(key, 0) for key in {*a, *b}}


def summary(totals: dict[str, float], processes: int) -> str:
    """The log's line, e.g. ``JAX: 12716 programs compiled by XLA in 186.8 s (lowered in 36.4 s), 2 processes``."""
    return (
        f"JAX: {int(totals.get('compile', 0))} programs compiled by XLA in {totals.get('compile_s', 0.0):.1f} s "
        f"(lowered in {totals.get('lower_s', 0.0):.1f} s), {processes} process{'es' if processes != 1 else ''}"
    )

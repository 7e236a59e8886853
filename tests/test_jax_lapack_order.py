"""Under ``jax.jit`` no two batched LAPACK calls of one optimizer step may run at once.

jaxlib's CPU LAPACK kernels (``geqrf``, the triangular solve, LU) split their batch over XLA's intra-op
thread pool and block until it is done; two started at once, one on each pool thread, wait for each other
for ever. On this project's two-core machine a jitted Adam step on two Stiefel groups (36 × St(768, 64)
and 36 × St(512, 64)) hung in 4 of 5 runs (jaxlib 0.10.2). ``_backend.ordered_after`` gives each group's
section and retraction a data dependency on the group before it (XLA's CPU runtime orders its thunks by
data, not by the control dependencies an ``optimization_barrier`` becomes), so the property checked here
is structural and does not depend on a race: in the compiled program, every pair of LAPACK custom calls
is ordered, one an ancestor of the other, for steps on several groups with the geodesic and the Cayley
retraction, and for manifold Muon.
"""

from __future__ import annotations

import re

import pytest

import geoarray
from geoarray import optim
from geoarray.manifolds import Grassmann, Stiefel

_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def _entry_graph(hlo: str) -> tuple[dict[str, set[str]], list[str]]:
    """(operands of every instruction of the ENTRY computation, the names of its LAPACK custom calls)."""
    lines = hlo.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ENTRY"))
    deps: dict[str, set[str]] = {}
    lapack: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("}"):
            break
        m = _LINE.match(line)
        if m is None:
            continue
        name, rest = m.groups()
        deps[name] = set(re.findall(r"%([\w.\-]+)", rest.split("metadata=")[0]))
        if "custom-call" in rest and "lapack_" in rest:
            lapack.append(name)
    return deps, lapack


def _ancestors(name: str, deps: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    stack = [name]
    while stack:
        for parent in deps.get(stack.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def _jax(backend):
    if backend.kind != "jax":
        pytest.skip("jaxlib's LAPACK custom calls under jax.jit: JAX only")
    import jax

    return jax


def _params(jnp):
    S, R, G = Stiefel(12, 3), Stiefel(10, 2), Grassmann(9, 2)
    params = [
        S.random(0, xp=jnp, batch_shape=(4,)),
        R.random(1, xp=jnp, batch_shape=(3,)),
        G.random(2, xp=jnp, batch_shape=(2,)),
    ]
    grads = [
        geoarray.random.normal(10 + k, tuple(p.shape), xp=jnp, dtype=p.dtype, scale=0.1) for k, p in enumerate(params)
    ]
    return params, grads, [S, R, G]


@pytest.mark.parametrize(
    "make",
    [
        lambda: optim.Adam(lr=0.01),
        lambda: optim.Adam(lr=0.01, retraction="cayley"),
        lambda: optim.Momentum(lr=0.01, alpha=0.5),
    ],
    ids=["adam-geodesic", "adam-cayley", "momentum"],
)
def test_the_lapack_calls_of_a_jitted_step_are_ordered(backend, make):
    jax = _jax(backend)
    params, grads, mans = _params(backend.xp)
    opt = make()
    state = opt.init(params, mans)
    hlo = jax.jit(opt.update).lower(params, grads, state).compile().as_text()
    deps, lapack = _entry_graph(hlo)
    assert len(lapack) >= 3, f"expected a geqrf per group at least, found {lapack}"
    ancestors = {name: _ancestors(name, deps) for name in lapack}
    for i, a in enumerate(lapack):
        for b in lapack[i + 1 :]:
            assert a in ancestors[b] or b in ancestors[a], f"{a} and {b} may run at once"


def test_the_check_sees_unordered_calls(backend):
    """The check itself: two independent batched QRs in one program are reported as unordered."""
    jax = _jax(backend)
    jnp = backend.xp
    A = jnp.ones((4, 6, 3)) + jnp.reshape(jnp.arange(72.0), (4, 6, 3))
    B = A[:, :5, :] * 2
    hlo = jax.jit(lambda a, b: (jnp.linalg.qr(a, mode="r"), jnp.linalg.qr(b, mode="r"))).lower(A, B).compile().as_text()
    deps, lapack = _entry_graph(hlo)
    assert len(lapack) == 2
    a, b = lapack
    assert a not in _ancestors(b, deps) and b not in _ancestors(a, deps)

"""One test suite for every backend.

The backend is chosen by ``--backend`` or the ``GEOARRAY_BACKEND`` environment variable (nox sets
it): ``numpy``, ``array-api-strict``, ``torch``, ``jax`` (CPU, float64), and ``cupy``,
``torch-cuda``, ``jax-cuda``, which skip every test with a one-line reason when no GPU is present.
"""

from __future__ import annotations

import os

import pytest

import geoarray
from _helpers import BACKENDS, Backend, load_backend
from geoarray._backend import HOST_READS


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        default=os.environ.get("GEOARRAY_BACKEND", "numpy"),
        choices=BACKENDS,
        help="array backend the suite runs on (default: $GEOARRAY_BACKEND or numpy)",
    )
    parser.addoption(
        "--host-reads",
        default=os.environ.get("GEOARRAY_HOST_READS", "cpu"),
        choices=HOST_READS,
        help="geoarray.set_host_reads policy for the whole run (default: $GEOARRAY_HOST_READS or cpu, the "
        "library's default); 'never' runs on the CPU what a GPU runs by default",
    )


def pytest_configure(config):
    name = config.getoption("--backend")
    if name not in BACKENDS:  # argparse checks --backend, not a default read from GEOARRAY_BACKEND
        raise pytest.UsageError(f"GEOARRAY_BACKEND={name!r} is not a backend; choose one of {', '.join(BACKENDS)}")
    config._geoarray_backend = load_backend(name)
    policy = config.getoption("--host-reads")
    if policy not in HOST_READS:
        raise pytest.UsageError(
            f"GEOARRAY_HOST_READS={policy!r} is not a host reads policy; choose one of {', '.join(HOST_READS)}"
        )
    geoarray.set_host_reads(policy)
    b = config._geoarray_backend
    if b.kind == "jax" and not b.skip:
        import _jax_compiles

        config._jax_compiles = _jax_compiles.start()  # the session's compile count (tests/_jax_compiles.py)
        config._jax_compiles_seen = ({}, 0)  # the xdist workers' totals and how many there were


def pytest_sessionfinish(session):
    counter = getattr(session.config, "_jax_compiles", None)
    if counter is not None and hasattr(session.config, "workeroutput"):  # an xdist worker: to the controller
        session.config.workeroutput["jax_compiles"] = counter.totals()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist: a worker finished; add its compile totals to the controller's."""
    totals = getattr(node, "workeroutput", {}).get("jax_compiles")
    config = node.config
    if totals is not None and hasattr(config, "_jax_compiles_seen"):
        import _jax_compiles

        seen, workers = config._jax_compiles_seen
        config._jax_compiles_seen = (_jax_compiles.add(seen, totals), workers + 1)


def pytest_terminal_summary(terminalreporter, config):
    counter = getattr(config, "_jax_compiles", None)
    if counter is None or hasattr(config, "workeroutput"):
        return
    import _jax_compiles

    seen, workers = config._jax_compiles_seen
    totals, processes = (seen, workers) if workers else (counter.totals(), 1)
    terminalreporter.write_line(_jax_compiles.summary(totals, processes))


def pytest_report_header(config):
    b: Backend = config._geoarray_backend
    reads = f", host reads {geoarray.get_host_reads()!r}"
    return f"geoarray backend: {b.name} (device {b.device}{reads})" + (f" -- {b.skip}" if b.skip else "")


def pytest_collection_modifyitems(config, items):
    b: Backend = config._geoarray_backend
    if b.skip:
        marker = pytest.mark.skip(reason=b.skip)
        for item in items:
            item.add_marker(marker)


@pytest.fixture(scope="session")
def backend(pytestconfig) -> Backend:
    return pytestconfig._geoarray_backend


@pytest.fixture(scope="session")
def xp(backend):
    """The standard-compatible namespace under test."""
    return backend.xp


@pytest.fixture(scope="session")
def device(backend):
    return backend.device


@pytest.fixture
def host_reads_policy():
    """``geoarray.set_host_reads`` for one test, the previous policy restored afterwards.

    On a GPU the default policy reads nothing to the host, so an eager retraction has a fixed doubling
    budget (``SYNC_FREE_DOUBLINGS``: ‖X‖₁ ≤ 16θ, larger steps come out NaN) and a skipped optimizer step
    is counted without a warning. Tests of steps beyond that budget, or of the warning, set ``"always"``:
    the behaviour they check needs a read, on every device. ``tests/test_host_reads.py`` checks the
    no-read route itself. ``pytest --host-reads never`` runs the suite on the CPU as a GPU would (the
    array-api-strict session does, standing in for CuPy, an array API library on a device)."""
    previous = geoarray.get_host_reads()
    yield geoarray.set_host_reads
    geoarray.set_host_reads(previous)


# -- geoarray.torch tests --------------------------------------------------------------------------


@pytest.fixture
def torch_only(backend):
    """Skip outside the torch sessions (use as ``pytestmark = pytest.mark.usefixtures("torch_only")``)."""
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")


@pytest.fixture
def torch_default_float32(torch_only):
    """torch's own default dtype, float32, for the test (the torch session sets float64): code ported
    from a torch library runs as it runs there."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@pytest.fixture
def torch(torch_only):
    import torch

    return torch


@pytest.fixture
def gt(torch_only):
    import geoarray.torch

    return geoarray.torch

"""One test suite for every backend.

The backend is chosen by ``--backend`` or the ``GEOARRAY_BACKEND`` environment variable (nox sets
it): ``numpy``, ``array-api-strict``, ``torch``, ``jax`` (CPU, float64), and ``cupy``,
``torch-cuda``, ``jax-cuda``, which skip every test with a one-line reason when no GPU is present.
"""

from __future__ import annotations

import os

import pytest

from _helpers import BACKENDS, Backend, load_backend


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        default=os.environ.get("GEOARRAY_BACKEND", "numpy"),
        choices=BACKENDS,
        help="array backend the suite runs on (default: $GEOARRAY_BACKEND or numpy)",
    )


def pytest_configure(config):
    name = config.getoption("--backend")
    if name not in BACKENDS:  # argparse checks --backend, not a default read from GEOARRAY_BACKEND
        raise pytest.UsageError(f"GEOARRAY_BACKEND={name!r} is not a backend; choose one of {', '.join(BACKENDS)}")
    config._geoarray_backend = load_backend(name)


def pytest_report_header(config):
    b: Backend = config._geoarray_backend
    return f"geoarray backend: {b.name} (device {b.device})" + (f" -- {b.skip}" if b.skip else "")


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


# -- geoarray.torch tests --------------------------------------------------------------------------


@pytest.fixture
def torch_only(backend):
    """Skip outside the torch sessions (use as ``pytestmark = pytest.mark.usefixtures("torch_only")``)."""
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")


@pytest.fixture
def torch(torch_only):
    import torch

    return torch


@pytest.fixture
def gt(torch_only):
    import geoarray.torch

    return geoarray.torch

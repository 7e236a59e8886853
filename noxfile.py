"""The cross-backend test matrix: one session per requirements file in backends/.

    nox -t cpu                 # numpy, array-api-strict, torch-cpu, jax-cpu (what CI runs)
    nox -s tests               # the same CPU matrix, by name
    nox -s tests-torch-cpu     # one backend
    nox -t cuda                # cupy, torch-cuda, jax-cuda: skipped without a GPU
    nox -s lint

CUDA sessions detect a missing GPU when this file loads and skip without building a venv.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).parent
# requirements file → (GEOARRAY_BACKEND value, device tag)
MATRIX = {
    "numpy": ("numpy", "cpu"),
    "array-api-strict": ("array-api-strict", "cpu"),
    "torch-cpu": ("torch", "cpu"),
    "jax-cpu": ("jax", "cpu"),
    "torch-cuda": ("torch-cuda", "cuda"),
    "jax-cuda": ("jax-cuda", "cuda"),
    "cupy-cuda12": ("cupy", "cuda"),
}
CPU_SESSIONS = [f"tests-{name}" for name, (_, tag) in MATRIX.items() if tag == "cpu"]


def _gpu_missing() -> str | None:
    """Why there is no usable NVIDIA GPU here, or None if there is one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA GPU: nvidia-smi is not on PATH"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no NVIDIA GPU: nvidia-smi failed ({exc})"
    if out.returncode != 0 or "GPU" not in out.stdout:
        return "no NVIDIA GPU: nvidia-smi lists no device"
    return None


GPU_MISSING = _gpu_missing()


def _make_session(name: str, backend: str, tag: str):
    requirements = ROOT / "backends" / f"{name}.txt"

    if tag == "cuda" and GPU_MISSING:

        @nox.session(name=f"tests-{name}", tags=[tag], venv_backend="none")
        def skipped(session: nox.Session) -> None:
            session.skip(f"tests-{name}: {GPU_MISSING}")

        return skipped

    @nox.session(name=f"tests-{name}", tags=[tag])
    def run(session: nox.Session) -> None:
        session.install("-r", str(requirements))
        session.install(".[test,demo]")  # demo: scikit-learn digits, matplotlib, tqdm (CLI and training tests)
        session.run(
            "pytest",
            "-p",
            "no:cacheprovider",
            *session.posargs,
            env={"GEOARRAY_BACKEND": backend},
        )

    return run


for _name, (_backend, _tag) in MATRIX.items():
    globals()[f"tests_{_name.replace('-', '_')}"] = _make_session(_name, _backend, _tag)


@nox.session(name="tests", venv_backend="none")
def tests(session: nox.Session) -> None:
    """The CPU matrix: queues every cpu-tagged session."""
    for name in CPU_SESSIONS:
        session.notify(name, posargs=session.posargs)


@nox.session(tags=["lint"])
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    paths = ["src", "tests", "benchmarks", "examples", "noxfile.py"]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)

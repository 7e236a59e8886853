"""The cross-backend test matrix: one session per requirements file in backends/.

    nox -t cpu                 # numpy, array-api-strict, torch-cpu, jax-cpu (what CI runs)
    nox -s tests               # the four backends of the CPU matrix, by name
    nox -s tests-torch-cpu     # one backend
    nox -t cuda                # cupy, torch-cuda, jax-cuda: skipped without a GPU
    nox -s lint                # ruff, and mypy over the public API
    nox -s docs                # the documentation site, warnings are errors; its gallery executed
    nox -s docs-fast           # the same without executing the gallery (part of nox -t cpu, so of CI)
    nox -s package             # sdist + wheel, twine check, the wheel in a fresh venv from outside the tree

CUDA sessions detect a missing GPU when this file loads and skip without building a venv.

Environments are built by uv when it is installed (``pip install 'nox[uv]'``, what .ci/run does), by
virtualenv and pip otherwise; each session logs its setup time (venv and installs) and pytest's 25
slowest tests, and the JAX sessions how many programs XLA compiled and in how long (``tests/_jax_compiles.py``).

``nox -t cpu`` (what .ci/run runs) holds the four backends and ``docs-fast``, so a broken docstring, an
unresolved cross-reference or an undocumented public name fails CI (about a minute with uv: 7 s of installs
once the test sessions filled uv's cache, a build of about 50 s). ``docs`` (the gallery's scripts, minutes) and
``package`` (a second venv) are not part of it; their fast parts are: tests/test_public_docs.py fails
every backend session on a public name without a docstring, and tests/test_packaging.py checks the
metadata and that the wheel's file list holds the package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]
# uv builds a session's venv in seconds where pip takes minutes (measured on the 2-core CI machine: the torch
# session's installs 33 s against 140 s, the five sessions' 1.5 min against 7); without uv, virtualenv and pip
nox.options.default_venv_backend = "uv|virtualenv"

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


def _workers(tag: str) -> list[str]:
    """pytest-xdist's options: one worker per core, at most 4 (each JAX worker holds ~2 GB of host
    memory), stealing work from the other's queue. On the 2-core CI machine the numpy suite took 86 s
    against 131 s in one process, torch 181 s against 280 s (the tests are single-threaded Python and
    small kernels). The GPU sessions share one card between the workers, which :func:`_gpu_env` makes
    possible."""
    n = min(4, os.cpu_count() or 1)
    return ["-n", str(n), "--dist", "worksteal"] if n > 1 else []


def _gpu_env(tag: str) -> dict[str, str]:
    """JAX takes 75% of a GPU's memory when it first touches it, per process: with several pytest
    workers (and torch beside it in the same process) the second would run out of memory. The GPU
    sessions let it allocate what it uses instead. A caller's setting wins."""
    if tag != "cuda" or "XLA_PYTHON_CLIENT_PREALLOCATE" in os.environ:
        return {}
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def _compiler_env(backend: str, tag: str, cache_dir: str) -> dict[str, str]:
    """How a session's compilers run: the torch sessions' inductor as :func:`_inductor_env` says; the JAX
    sessions' XLA as follows. Much of their time is XLA compiling the tests' many small programs, each
    once (every eager operation of a new shape is one: 11,047 compilations in the CPU session, 398 s of its two
    workers' ~1,240 s, with the settings below), so:

    * on the CPU, XLA at optimisation level 0 and without its fusion emitters, which compile faster than
      they lose running the tests: one eager operation 21 ms to compile against 40 ms at level 0 alone and
      46 ms by default; the session 740 s against 1,051 s at level 0 alone (2-core AMD EPYC, 2 workers). Only
      the tests' compiler: users' programs are unaffected, and the results agree to the tests' tolerances
      (bit-equality is only asked of a computation repeated, which these settings repeat as well);
    * without splitting a program's LLVM module for parallel code generation
      (``--xla_cpu_parallel_codegen_split_count=1``): the parts of a small program cost more to split and
      hand to threads than they save, and the pytest workers already keep both cores busy. Nine test files
      (~3,520 programs), ``-n 2``, three interleaved pairs on a 2-core Xeon: XLA's compiling 63.2, 49.1,
      56.5 s against 69.4, 65.0, 62.3 s, pytest 65.5, 48.4, 56.5 s against 68.6, 60.6, 58.0 s;
    * JAX's persistent compilation cache, in a directory of this session's own (made empty, removed at its
      end): a program that one pytest worker, or a subprocess of the tests, compiled is loaded by the
      other instead of compiled again (the CPU session 635 s against 740 s).

    A caller's XLA_FLAGS and JAX_COMPILATION_CACHE_DIR win. The tests themselves lower programs in shared
    MLIR contexts (``tests/_jax_lowering.py``: the JAX CPU session's pytest 185 s against 283 s)."""
    if backend in ("torch", "torch-cuda"):
        return _inductor_env(cache_dir)
    if backend not in ("jax", "jax-cuda"):
        return {}
    env = {}
    if tag == "cpu" and "XLA_FLAGS" not in os.environ:
        env["XLA_FLAGS"] = (
            "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
            "--xla_cpu_parallel_codegen_split_count=1"
        )
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        env.update(
            JAX_COMPILATION_CACHE_DIR=cache_dir,
            # every program, however small or quick to compile: the eager operations are the bulk
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    return env


def _inductor_env(cache_dir: str) -> dict[str, str]:
    """How the torch sessions' ``torch.compile`` with inductor (a few tests and a documentation block; the
    rest trace with ``backend="aot_eager"``) compiles, as CI's clean machine does it:

    * in a cache directory of this session's own (made empty, removed at its end), shared by the pytest
      workers and the tests' subprocesses. Inductor's default, ``/tmp/torchinductor_$USER``, outlives
      the run: on a developer's machine it held the kernels of earlier runs, so a local run measured the
      three inductor tests at 38 s where a clean machine takes 67 s (2026-11-30, this Xeon);
    * without inductor's probe of the CPU's vector instruction sets (``TORCHINDUCTOR_VEC_ISA_OK=1``: the
      sets /proc/cpuinfo lists are used as they are). With an empty cache every process built and loaded
      a test library for each of them, 5–10 s before its first kernel (one compiled Adam step from an
      empty cache, three interleaved pairs on a machine whose speed varied: 18.6, 30.0, 35.0 s against
      24.5, 39.8, 40.0 s). The kernels themselves are built as before.

    A caller's TORCHINDUCTOR_CACHE_DIR and TORCHINDUCTOR_VEC_ISA_OK win."""
    env = {}
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    if "TORCHINDUCTOR_VEC_ISA_OK" not in os.environ:
        env["TORCHINDUCTOR_VEC_ISA_OK"] = "1"
    return env


def _host_reads_env(backend: str) -> dict[str, str]:
    """The array-api-strict session runs without host reads (``pytest --host-reads never``): it stands for
    an array API library on a device, and CuPy on a GPU (like torch and JAX there) reads nothing by default,
    so an eager step does fixed work masked on the device. NumPy, torch and JAX on the CPU keep the
    library's default and test the reading route; this session tests the other on the CPU. A caller's
    GEOARRAY_HOST_READS wins."""
    if backend != "array-api-strict" or "GEOARRAY_HOST_READS" in os.environ:
        return {}
    return {"GEOARRAY_HOST_READS": "never"}


def _bytecode_env() -> dict[str, str]:
    """Python writes the bytecode of what a test session's processes import (``PYTHONDONTWRITEBYTECODE``
    emptied: CI sets it, and this session's venv and test tree are its own). The first pytest worker
    to import a module compiles it, every later process (the other worker, the tests' subprocesses: the
    CLI's, the examples', the crash tests') loads it, and pytest keeps the test modules' rewritten
    assertions in ``tests/__pycache__`` (ignored by git) for the next session. With writing off, each
    process compiled again what it imported: the torch session's imports took 14.1 s against 6.4 s
    with bytecode, and pytest's collection 7.4–7.8 s against 3.4–3.6 s with the test modules' bytecode
    (one process, 2-core Xeon). Compiling only what is imported replaces uv's compiling everything it
    installs (:func:`_uv_env`): torch's requirements installed in 16.2 s with bytecode, 1.7 s without.
    ``nox -s tests-numpy tests-array-api-strict`` from a clean tree, alternating: 160.6 and 141.8 s against
    163.5 and 152.0 s (installs 4 s against 15 s; the first session's tests a little slower, compiling what
    they import, the second's a little faster). ``nox -s tests-torch-cpu`` alone, alternating: 217.7 and
    252.5 s against 211.3 and 268.5 s (installs 2.7 against 19 s; its tests 208 and 241 s against 187 and
    245 s: two workers and inductor's compile processes compile the same first imports side by side, and the
    machine's speed drifted between the pairs), so about even there."""
    return {"PYTHONDONTWRITEBYTECODE": ""}


def _discard_venv(session: nox.Session) -> None:
    """With ``GEOARRAY_NOX_DISCARD_VENVS=1`` (what .ci/run sets), delete a session's virtualenv when the
    session ends, passed or failed. CI builds each venv once, and side by side the matrix's venvs took
    4.8 GB (measured in .nox: numpy and array-api-strict 0.4 GB each, torch 1.3, jax 0.9, docs-fast 1.8);
    a CI run once failed installing torch for the third session with "No space left on device". One venv
    at a time, .nox peaked at 1.8 GB. Off by default: nox's ``reuse_venv`` keeps them for the next local
    run."""
    if os.environ.get("GEOARRAY_NOX_DISCARD_VENVS") != "1":
        return
    location = getattr(session.virtualenv, "location", None)
    if location:
        shutil.rmtree(location, ignore_errors=True)


def _pip_find_links() -> str | None:
    """The folders or pages in which pip's configuration finds wheels (``find-links``), or None."""
    if os.environ.get("PIP_FIND_LINKS"):
        return os.environ["PIP_FIND_LINKS"]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _uv_env() -> dict[str, str]:
    """What uv needs to install what pip installs here (uv reads none of pip's configuration).

    On the CI machines the pinned CPU build of torch (backends/torch-cpu.txt) is found through pip's
    ``find-links``, without which uv would take PyPI's CUDA build of the same version (several GB):
    UV_FIND_LINKS passes them on. pip compiles every module it installs to bytecode; uv does not
    (UV_COMPILE_BYTECODE unset): a session compiles the modules its processes import, once
    (:func:`_bytecode_env`), and no other. A caller's UV_* settings win."""
    env = {}
    links = os.environ.get("UV_FIND_LINKS") or _pip_find_links()
    if links:
        env["UV_FIND_LINKS"] = links
    return env


_LOADED = time.time()


class _Setup:
    """The time a session spends on its environment, logged before its tests: the venv's creation (from
    the moment its ``pyvenv.cfg`` was written; 0 for a venv reused from an earlier run) and the installs."""

    def __init__(self, session: nox.Session) -> None:
        self.session = session
        self.start = time.time()
        cfg = Path(getattr(session.virtualenv, "location", "") or ".") / "pyvenv.cfg"
        made = cfg.stat().st_mtime if cfg.is_file() else self.start
        self.venv_s = self.start - made if made >= _LOADED else 0.0
        session.env.update(_uv_env())

    def install(self, *args: str) -> None:
        self.session.install(*args)

    def log(self) -> None:
        backend = getattr(self.session.virtualenv, "venv_backend", "none")
        installs = time.time() - self.start
        self.session.log(
            f"setup: {self.venv_s + installs:.1f} s (venv {self.venv_s:.1f} s, installs {installs:.1f} s; {backend})"
        )


def _make_session(name: str, backend: str, tag: str):
    requirements = ROOT / "backends" / f"{name}.txt"

    if tag == "cuda" and GPU_MISSING:

        @nox.session(name=f"tests-{name}", tags=[tag], venv_backend="none")
        def skipped(session: nox.Session) -> None:
            session.skip(f"tests-{name}: {GPU_MISSING}")

        return skipped

    @nox.session(name=f"tests-{name}", tags=[tag])
    def run(session: nox.Session) -> None:
        cache = tempfile.mkdtemp(prefix=f"geoarray-{name}-compilation-cache-")
        try:
            setup = _Setup(session)
            setup.install("-r", str(requirements))
            setup.install(".[test,demo]")  # demo: scikit-learn digits, matplotlib, tqdm (CLI and training tests)
            setup.log()
            session.run(
                "pytest",
                "-p",
                "no:cacheprovider",
                "--durations=25",  # the slowest tests in CI's log: where the session's time goes
                *_workers(tag),
                *session.posargs,  # after: `-- -n 0` runs in one process
                env={
                    "GEOARRAY_BACKEND": backend,
                    **_compiler_env(backend, tag, cache),
                    **_gpu_env(tag),
                    **_host_reads_env(backend),
                    **_bytecode_env(),
                },
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)
            _discard_venv(session)

    return run


for _name, (_backend, _tag) in MATRIX.items():
    globals()[f"tests_{_name.replace('-', '_')}"] = _make_session(_name, _backend, _tag)


@nox.session(name="tests", venv_backend="none")
def tests(session: nox.Session) -> None:
    """The four backends of the CPU matrix (``nox -t cpu`` adds docs-fast)."""
    for name in CPU_SESSIONS:
        session.notify(name, posargs=session.posargs)


@nox.session(tags=["lint"])
def lint(session: nox.Session) -> None:
    """ruff over the repository; mypy over the package (configuration: pyproject.toml)."""
    session.install("ruff>=0.5", "mypy>=1.11")
    paths = ["src", "tests", "benchmarks", "examples", "docs", "noxfile.py"]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    session.install(".")
    session.run("mypy")


def _install_docs(session: nox.Session) -> None:
    # the API pages import geoarray.torch and geoarray.jax
    setup = _Setup(session)
    setup.install("-r", str(ROOT / "backends" / "torch-cpu.txt"))
    setup.install("jax[cpu]>=0.4.30", "optax>=0.2")
    setup.install(".[docs]")
    setup.log()
    session.env.setdefault("MPLBACKEND", "agg")


@nox.session(tags=["docs"])
def docs(session: nox.Session) -> None:
    """The documentation site in docs/_build/html (-W: a warning, a broken docstring or an undocumented
    public name fails the build). Imports geoarray.torch and geoarray.jax, so it installs both. The gallery
    (docs/gallery/plot_*.py) runs at build time and is cached in docs/auto_examples (a script reruns only
    when it changes); ``GEOARRAY_DOCS_GALLERY=0 nox -s docs`` builds without running it (the fast mode)."""
    _install_docs(session)
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html", *session.posargs)


@nox.session(name="docs-fast", tags=["cpu"])
def docs_fast(session: nox.Session) -> None:
    """The documentation site in the fast mode (the gallery's pages without running its scripts) into a
    temporary directory, warnings as errors: the CI check that docstrings, cross-references and the
    public API's documentation build. Without viewcode's source pages (``GEOARRAY_DOCS_SOURCE=0``, see
    docs/conf.py): the build 30–33 s against 37–45 s (-j auto, interleaved, 2-core Xeon), and they log no
    warning that -W could turn into a failure."""
    import tempfile

    try:
        _install_docs(session)
        session.env["GEOARRAY_DOCS_GALLERY"] = "0"
        session.env["GEOARRAY_DOCS_SOURCE"] = "0"  # no viewcode pages (docs/conf.py)
        with tempfile.TemporaryDirectory() as out:
            # -j auto: the read phase on every core (2 cores: 37 s against 46 s)
            session.run(
                "sphinx-build", "-j", "auto", "-W", "--keep-going", "-q", "-b", "html", "docs", out, *session.posargs
            )
    finally:
        _discard_venv(session)


@nox.session(tags=["package"])
def package(session: nox.Session) -> None:
    """Build the sdist and the wheel into dist/, check them with twine, install the wheel into a fresh
    venv and run `geoarray --help` and the quick start there from a directory outside the source tree
    (a file missing from the wheel fails here, not at a user's)."""
    import tempfile

    session.install("build>=1.2", "twine>=5")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist), str(ROOT))
    wheels = sorted(dist.glob("*.whl"))
    sdists = sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        session.error(f"expected one wheel and one sdist in {dist}, found {[p.name for p in dist.iterdir()]}")
    session.run("twine", "check", "--strict", *map(str, wheels + sdists))
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        session.run("python", "-m", "venv", str(venv))
        bin_dir = venv / "bin"
        session.run(str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(wheels[0]), external=True)
        with session.chdir(tmp):  # outside the source tree: only the installed wheel can be imported
            session.run(str(bin_dir / "geoarray"), "--help", external=True)
            session.run(str(bin_dir / "python"), str(ROOT / "tests" / "wheel_smoke.py"), external=True)

"""Crash consistency of ``geoarray.train`` checkpoints: kill the writer anywhere, resume bit-identically.

A child process (``os.fork`` of the test process, so that no backend is imported again) trains the
small classification transformer of ``test_train`` for 2 epochs × 3 steps with a checkpoint after
every step (``keep=2``) and dies at the k-th file-system call of its saves — every ``mkdir``, file
creation, ``write``, ``fsync`` (of files and of directories), ``rename`` and removal goes through
``geoarray._io.fs``, which the child replaces by a shim, as SQLite's crash tests do through a VFS:

* ``exit``: ``os._exit`` at the call (before it runs; a write that is hit writes half its bytes first,
  a torn write);
* ``sigkill``: the same, but the child sends itself SIGKILL;
* ``power``: as ``exit``, and every file written since its last ``fsync`` is cut to half its length
  first (what a power loss does to data still in the page cache).

k runs over every call of the uninterrupted run (about 18 per save, 6 saves: 110 calls) with
``power`` at odd k and ``sigkill`` + the power loss at even k; ``GEOARRAY_CRASH_SWEEP=full`` runs
every mode at every k instead (330 kills). Six more children are SIGKILLed by the parent at
arbitrary moments of the run, and 10 runs are killed twice (the resumed child dies at its 3rd call).
After each death the parent checks that every committed checkpoint loads and equals the
uninterrupted run's state at its step bit for bit (so no kill leaves a state that loads wrongly),
then resumes with ``fit(resume=True)`` and checks that the result equals the uninterrupted run bit
for bit (parameters, optimizer state, history without wall-clock seconds). The children and the
resumed runs skip the kernel's fsync (``_NoSync``: a killed process loses nothing of the page cache,
the power loss is simulated), the counting run does them. The number of kill points and the time are printed (``-s``).
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import optree
import pytest
from _small_fit import like as _like
from _small_fit import run

from _helpers import to_numpy
from geoarray import _io
from geoarray.train import list_checkpoints, load_checkpoint

EPOCHS, BATCH = 2, 8  # 3 steps per epoch, 6 in all
MODES = ("exit", "sigkill", "power", "sigkill+power")
_KILLED = 77


def _run(xp, device, **kw):
    return run(xp, device, **{"epochs": EPOCHS, "batch_size": BATCH, **kw})


def _host(tree):
    return [to_numpy(leaf) for leaf in optree.tree_leaves(tree)]


def _same(a, b):
    return len(a) == len(b) and all(u.dtype == v.dtype and np.array_equal(u, v) for u, v in zip(a, b, strict=True))


def _history(h):
    return [{k: v for k, v in rec.items() if k != "seconds"} for rec in h]


class _NoSync(_io.FileSystem):
    """The file system without the kernel's fsync (≈4 ms each here): a killed process loses nothing
    of the page cache, and a power loss is simulated explicitly, so the kernel's work is not needed."""

    def fsync(self, fh):
        fh.flush()

    def fsync_dir(self, path):
        pass


class _Shim(_NoSync):
    """Counts the calls; at call number ``at`` (1-based) kills the process the way ``mode`` says.
    ``real=True`` performs the real fsyncs (the counting run)."""

    def __init__(self, at=None, mode="exit", real=False):
        self.at, self.mode, self.calls, self.real = at, mode, 0, real
        self.dirty: set[str] = set()

    def _tick(self, fh=None, data=None):
        self.calls += 1
        if self.calls != self.at:
            return
        if data is not None:  # a torn write
            fh.write(data[: len(data) // 2])
            fh.flush()
        if self.mode.endswith("power"):
            for path in self.dirty:
                if os.path.exists(path):
                    os.truncate(path, os.path.getsize(path) // 2)
        if self.mode.startswith("sigkill"):
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(_KILLED)

    def open_write(self, path):
        self._tick()
        shim, fh = self, super().open_write(path)

        class Tracked:
            name = path

            def write(self, data):
                shim._tick(fh, data)
                shim.dirty.add(path)
                return fh.write(data)

            def __getattr__(self, attr):
                return getattr(fh, attr)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                fh.close()

        return Tracked()

    def fsync(self, fh):
        self._tick()
        (_io.FileSystem.fsync if self.real else _NoSync.fsync)(self, fh)
        self.dirty.discard(fh.name)

    def fsync_dir(self, path):
        self._tick()
        (_io.FileSystem.fsync_dir if self.real else _NoSync.fsync_dir)(self, path)

    def mkdir(self, path):
        self._tick()
        super().mkdir(path)

    def makedirs(self, path):
        self._tick()
        super().makedirs(path)

    def replace(self, src, dst):
        self._tick()
        super().replace(src, dst)
        # unsynced data moves with its file (or its directory)
        moved = {p for p in self.dirty if p == src or p.startswith(src + os.sep)}
        self.dirty = (self.dirty - moved) | {dst + p[len(src) :] for p in moved}

    def remove(self, path):
        self._tick()
        super().remove(path)

    def rmtree(self, path):
        self._tick()
        super().rmtree(path)


def _child(xp, device, ck, shim, resume=False):
    """Fork a child that trains (or resumes) with ``shim`` as the file system; returns its pid."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            _io.fs = shim
            _run(xp, device, checkpoint_path=ck, checkpoint_every=1, keep=2, resume=resume)
            code = 0  # finished without being killed
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _check_after_death(xp, device, ck, like, per_step, final):
    """Every committed checkpoint equals the reference at its step; the resumed run equals the reference."""
    for step, path in list_checkpoints(ck):
        params, state, meta = load_checkpoint(path, **like)
        assert meta["steps"] == step
        assert _same(_host((params, state)), per_step[step]), f"{path} does not hold the state of step {step}"
    saved, _io.fs = _io.fs, _NoSync()
    try:
        resumed = _run(xp, device, checkpoint_path=ck, checkpoint_every=1, keep=2, resume=True)
    finally:
        _io.fs = saved
    assert resumed.steps == final.steps and _history(resumed.history) == _history(final.history)
    assert _same(_host((resumed.params, resumed.opt_state)), _host((final.params, final.opt_state)))
    assert [s for s, _ in list_checkpoints(ck)][-2:] == [EPOCHS * 3 - 1, EPOCHS * 3]


def test_kill_at_every_file_system_call_then_resume_bit_identically(xp, device, backend, tmp_path):
    if backend.kind == "jax":
        pytest.skip(
            "os.fork() after JAX has started its thread pools can deadlock (JAX warns so), and a fresh JAX process "
            "needs ~9 s for this run's first eager steps (measured), ~15 min for the 110 kill points; JAX's resume "
            "is checked bit-identically in-process by test_train.test_resume_inside_an_epoch_is_bit_identical"
        )
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork (POSIX)")
    if backend.name in ("cupy", "torch-cuda"):
        pytest.skip(
            "a child forked from a process that has initialised CUDA cannot use CUDA (cudaErrorInitializationError, "
            "measured on an H200); checkpoints are written from host copies, so the CPU sessions' kill sweep covers "
            "the same files"
        )
    t_start = time.perf_counter()
    final = _run(xp, device)
    per_step = {s: _host((r.params, r.opt_state)) for s in range(1, EPOCHS * 3 + 1) for r in [_stopped(xp, device, s)]}
    like = _like(xp, device)

    # the number of file-system calls of an uninterrupted run with a checkpoint after every step
    counter = _Shim(real=True)
    saved, _io.fs = _io.fs, counter
    try:
        t0 = time.perf_counter()
        _run(xp, device, checkpoint_path=tmp_path / "count", checkpoint_every=1, keep=2)
        run_seconds = time.perf_counter() - t0
    finally:
        _io.fs = saved
    n_calls = counter.calls
    assert n_calls >= 6 * 15, n_calls

    if os.environ.get("GEOARRAY_CRASH_SWEEP") == "full":
        points = [(k, mode) for mode in MODES[:3] for k in range(1, n_calls + 1)]
    else:
        points = [(k, MODES[2] if k % 2 else MODES[3]) for k in range(1, n_calls + 1)]
    kills = 0
    for k, mode in points:
        ck = tmp_path / f"{mode}-{k}"
        _, status = os.waitpid(_child(xp, device, ck, _Shim(k, mode)), 0)
        if mode.startswith("sigkill"):
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (mode, k, status)
        else:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == _KILLED, (mode, k, status)
        _check_after_death(xp, device, ck, like, per_step, final)
        kills += 1
    # SIGKILL from outside at arbitrary moments of the run
    for i, frac in enumerate(np.linspace(0.05, 0.95, 6)):
        ck = tmp_path / f"external-{i}"
        pid = _child(xp, device, ck, _NoSync())
        time.sleep(frac * run_seconds)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _check_after_death(xp, device, ck, like, per_step, final)
        kills += 1
    # killed twice: the resumed run dies too (at its 3rd call: a leftover of the first death is being removed
    # or the first save is starting), then the parent resumes
    twice = 0
    for k in range(3, n_calls, 11):
        ck = tmp_path / f"twice-{k}"
        _, status = os.waitpid(_child(xp, device, ck, _Shim(k, "power")), 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == _KILLED, (k, status)
        _, status = os.waitpid(_child(xp, device, ck, _Shim(3, "power"), resume=True), 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == _KILLED, (k, status)
        _check_after_death(xp, device, ck, like, per_step, final)
        twice += 1
        kills += 2
    print(
        f"\n{backend.name}: {kills} kills ({len(points)} at the {n_calls} file-system calls + 6 external SIGKILLs + "
        f"{twice} runs killed twice), "
        f"every resumed run bit-identical, {time.perf_counter() - t_start:.1f} s"
    )


def _stopped(xp, device, step):
    """The uninterrupted run's state after ``step`` steps (stopped there by a callback)."""

    def stop(info):
        if info["step"] == step:
            raise KeyboardInterrupt

    r = _run(xp, device, callback=stop)
    assert r.steps == step
    return r

"""File-system faults during a checkpoint save: disk full, permission denied, read-only file system,
a path that is a file.

The faults are injected as ``OSError`` at each file-system call of a save (through
``geoarray._io.fs``, the one door of every save). For each errno × call:

* the error is an ``OSError`` of that errno (``PermissionError`` for EACCES) whose message names the
  checkpoint directory and the checkpoint that is intact;
* the previous checkpoints load and equal what they held before, bit for bit, and nothing of the
  failed save remains (no temporary directory);
* the arrays given to the save are the same objects holding the same bits (memory untouched);
* through ``fit``: the exception carries ``fit_result``, the run's state after the step whose save
  failed (equal to the uninterrupted run's state at that step), and ``fit(resume=True)`` afterwards
  ends bit-identical to the uninterrupted run.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import optree
import pytest
from _small_fit import like as _like
from _small_fit import run

from _helpers import to_numpy
from geoarray import _io
from geoarray.train import list_checkpoints, load_checkpoint, save_checkpoint

ERRNOS = (errno.ENOSPC, errno.EACCES, errno.EROFS)


def _run(xp, device, **kw):
    return run(xp, device, **{"epochs": 2, **kw})


def _host(tree):
    return [to_numpy(leaf) for leaf in optree.tree_leaves(tree)]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


class _Faulty(_io.FileSystem):
    """Raises ``OSError(code)`` at the ``at``-th call (1-based); counts calls otherwise."""

    def __init__(self, at=None, code=errno.ENOSPC):
        self.at, self.code, self.calls = at, code, 0

    def _tick(self, path):
        self.calls += 1
        if self.calls == self.at:
            raise OSError(self.code, os.strerror(self.code), path)

    def open_write(self, path):
        self._tick(path)
        return super().open_write(path)

    def fsync(self, fh):
        self._tick(fh.name)
        super().fsync(fh)

    def fsync_dir(self, path):
        self._tick(path)
        super().fsync_dir(path)

    def mkdir(self, path):
        self._tick(path)
        super().mkdir(path)

    def makedirs(self, path):
        self._tick(path)
        super().makedirs(path)

    def replace(self, src, dst):
        self._tick(src)
        super().replace(src, dst)

    def rmtree(self, path):
        self._tick(path)
        super().rmtree(path)


@pytest.fixture
def faulty(monkeypatch):
    def install(fs):
        monkeypatch.setattr(_io, "fs", fs)
        return fs

    return install


def test_fault_at_every_call_of_a_save(xp, device, tmp_path, faulty):
    ck = tmp_path / "ck"
    r = _run(xp, device, epochs=1, checkpoint_path=ck, checkpoint_every=1, keep=2)  # steps 2 and 3 kept
    like = _like(xp, device)
    before = {s: _host(load_checkpoint(p, **like)[:2]) for s, p in list_checkpoints(ck)}
    arrays = (r.params, r.opt_state)
    host_before = _host(arrays)
    ids = [id(a) for a in optree.tree_leaves(arrays)]

    n_calls = _calls_of_one_save(ck, r, faulty)
    cases = 0
    for code in ERRNOS:
        for k in range(1, n_calls + 1):
            faulty(_Faulty(k, code))
            with pytest.raises(OSError) as info:
                save_checkpoint(ck, r.params, r.opt_state, {"step": 4}, step=4, keep=2)
            exc = info.value
            assert exc.errno == code and str(ck) in str(exc) and "is intact" in str(exc), (code, k, str(exc))
            if code == errno.EACCES:
                assert isinstance(exc, PermissionError)
            faulty(_io.FileSystem())
            committed = [s for s, _ in list_checkpoints(ck)]
            if 4 in committed:  # the fault came after the commit (fsync of DIR or the pruning): step 4 is whole
                assert "ckpt-000000004" in str(exc)
                params, state, meta = load_checkpoint(ck / "ckpt-000000004", **like)
                assert meta == {"step": 4} and _same(_host((params, state)), host_before)
                _reset(ck, before)
            for s, host in before.items():
                assert _same(_host(load_checkpoint(ck / f"ckpt-{s:09d}", **like)[:2]), host)
            assert sorted(n for n in os.listdir(ck) if not n.startswith(".del-")) == [
                f"ckpt-{s:09d}" for s in sorted(before)
            ], (code, k, os.listdir(ck))
            assert [id(a) for a in optree.tree_leaves(arrays)] == ids and _same(_host(arrays), host_before)
            cases += 1
    assert cases == len(ERRNOS) * n_calls


def _calls_of_one_save(ck, r, faulty):
    counter = faulty(_Faulty())
    save_checkpoint(ck, r.params, r.opt_state, {"probe": 1}, step=99, keep=None)
    faulty(_io.FileSystem())
    os.rename(ck / "ckpt-000000099", ck.parent / "probe")
    assert counter.calls >= 12, counter.calls
    return counter.calls


def _reset(ck, before):
    """Remove what a save that failed after its commit left, so that the next case starts from ``before``."""
    import shutil

    for name in os.listdir(ck):
        if name not in {f"ckpt-{s:09d}" for s in before}:
            shutil.rmtree(ck / name)


def test_fault_inside_fit_keeps_the_run_and_resume_completes(xp, device, tmp_path, faulty):
    ref = _run(xp, device)
    at_step = {s: _host((r.params, r.opt_state)) for s in (3,) for r in [_run(xp, device, callback=_stop(s))]}
    counter = faulty(_Faulty())
    _run(xp, device, epochs=1, checkpoint_path=tmp_path / "count")
    ck = tmp_path / "ck"
    # the first checkpoint (step 3, end of epoch 1) is whole; the 4th call of the second (step 6) hits a full disk
    faulty(_Faulty(counter.calls + 4, errno.ENOSPC))
    with pytest.raises(OSError, match=r"No space left.*ckpt-000000003.* is intact") as info:
        _run(xp, device, checkpoint_path=ck)
    faulty(_io.FileSystem())
    result = info.value.fit_result
    assert result.steps == 6 and len(result.history) == 2
    assert _same(_host((result.params, result.opt_state)), _host((ref.params, ref.opt_state)))
    assert [s for s, _ in list_checkpoints(ck)] == [3] and sorted(os.listdir(ck)) == ["ckpt-000000003"]
    assert _same(_host(load_checkpoint(ck, **_like(xp, device))[:2]), at_step[3])
    resumed = _run(xp, device, checkpoint_path=ck, resume=True)
    assert _same(_host((resumed.params, resumed.opt_state)), _host((ref.params, ref.opt_state)))
    # the history JSON (out=) of the first epoch cannot be written: the error names it, the run is returned
    out = tmp_path / "run" / "h.json"
    faulty(_Faulty(2, errno.EACCES))  # call 1 creates the parent directory, call 2 the temporary file
    with pytest.raises(PermissionError, match=r"could not write .*h\.json.* is left as it was") as info:
        _run(xp, device, out=out)
    assert info.value.fit_result.steps == 3 and not out.exists() and os.listdir(out.parent) == []


def _stop(step):
    def callback(info):
        if info["step"] == step:
            raise KeyboardInterrupt

    return callback


def test_path_is_a_file(xp, device, tmp_path):
    r = _run(xp, device, epochs=1)
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match=r"afile.* is a file"):
        save_checkpoint(afile, r.params, r.opt_state)
    assert afile.read_text() == "not a directory"
    with pytest.raises(ValueError, match=r"checkpoint_path .*afile.* is a file"):
        _run(xp, device, epochs=1, checkpoint_path=afile)
    with pytest.raises(ValueError, match=r"afile.* is a file"):
        load_checkpoint(afile, **_like(xp, device))


def test_read_only_directory(xp, device, tmp_path):
    """A real read-only directory (chmod 555): refused before training starts, naming the path."""
    if os.name != "posix" or os.geteuid() == 0:
        pytest.skip("root ignores directory permissions; the EACCES/EROFS injection above covers this case")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match=r"ro.* is not writable"):
            _run(xp, device, epochs=1, checkpoint_path=ro)
    finally:
        ro.chmod(0o755)

"""``fit(checkpoint_every_seconds=...)``: checkpoints on a time interval, with the clock injected.

The clock of the interval is ``geoarray.train._monotonic``; these tests replace it with a clock that
the step callback advances (t = step × ``tick`` seconds), so which steps are checkpointed is exact and
independent of the machine's speed. Checked on every backend:

* a checkpoint follows the first step that ends ``checkpoint_every_seconds`` after the last one (or
  the start of the call), the end of an epoch is no checkpoint of its own then, and the last step is;
* with ``checkpoint_every`` as well, whichever comes first;
* a run interrupted twice and resumed with other intervals (so its checkpoints fall on other steps)
  ends bit-identical to an uninterrupted run without checkpoints, history included (less seconds);
* bad values are refused before anything is created, naming the argument, the value and the fix.
"""

from __future__ import annotations

import datetime
import math

import numpy as np
import optree
import pytest
from _small_fit import run

from _helpers import to_numpy
from geoarray import train
from geoarray.train import list_checkpoints


def _run(xp, device, **kw):
    return run(xp, device, **{"epochs": 3, **kw})


@pytest.fixture
def clock(monkeypatch):
    """A fake ``train._monotonic``: ``clock(tick, stop=None)`` sets the time to 0 and returns a step callback
    that sets it to step × tick (the run's step count, which a resumed run continues) and raises
    KeyboardInterrupt after step ``stop``, as Ctrl-C would."""
    now = [0.0]
    monkeypatch.setattr(train, "_monotonic", lambda: now[0])

    def callback_for(tick, stop=None):
        now[0] = 0.0

        def callback(info):
            now[0] = info["step"] * tick
            if info["step"] == stop:
                raise KeyboardInterrupt

        return callback

    return callback_for


def _steps(path):
    return [s for s, _ in list_checkpoints(path)]


def _host(result):
    return [to_numpy(leaf) for leaf in optree.tree_leaves((result.params, result.opt_state))]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


def _history(result):
    return [{k: v for k, v in h.items() if k != "seconds"} for h in result.history]


def test_checkpoints_follow_the_clock(xp, device, tmp_path, clock):
    # t = step s; interval 1.5 s: due at steps 2, 4, 6, 8 (each 2 s after the last), and step 9 is the last
    # step; the end of epoch 1 (step 3, 1 s after step 2) is no checkpoint
    r = _run(xp, device, checkpoint_path=tmp_path / "a", checkpoint_every_seconds=1.5, keep=None, callback=clock(1.0))
    assert _steps(tmp_path / "a") == [2, 4, 6, 8, 9] and r.steps == 9
    # a timedelta is the same interval
    _run(
        xp,
        device,
        checkpoint_path=tmp_path / "b",
        checkpoint_every_seconds=datetime.timedelta(milliseconds=1500),
        keep=None,
        callback=clock(1.0),
    )
    assert _steps(tmp_path / "b") == [2, 4, 6, 8, 9]
    # an interval longer than the run: only the last step
    _run(xp, device, checkpoint_path=tmp_path / "c", checkpoint_every_seconds=1e6, keep=None, callback=clock(1.0))
    assert _steps(tmp_path / "c") == [9]


def test_steps_and_seconds_whichever_comes_first(xp, device, tmp_path, clock):
    # every 4 steps or 2.5 s: 3 (3 s), 4 (step), 7 (3 s after 4), 8 (step), 9 (last)
    _run(
        xp,
        device,
        checkpoint_path=tmp_path,
        checkpoint_every=4,
        checkpoint_every_seconds=2.5,
        keep=None,
        callback=clock(1.0),
    )
    assert _steps(tmp_path) == [3, 4, 7, 8, 9]


def test_resumed_with_other_intervals_is_bit_identical(xp, device, tmp_path, clock):
    straight = _run(xp, device)
    ck = dict(checkpoint_path=tmp_path, keep=None)
    # run 1: a checkpoint every 2 s of t = step, Ctrl-C after step 5 (checkpoints 2 and 4)
    first = _run(xp, device, checkpoint_every_seconds=2.0, callback=clock(1.0, stop=5), **ck)
    assert first.interrupted and _steps(tmp_path) == [2, 4]
    # run 2 resumes at step 4 with a 1 s interval at 0.4 s per step, the clock at 0 when the call begins:
    # a checkpoint at step 5 (t = 2), none at 6 (the end of epoch 2, 0.4 s later) or 7; Ctrl-C after step 8
    second = _run(xp, device, checkpoint_every_seconds=1.0, callback=clock(0.4, stop=8), resume=True, **ck)
    assert second.interrupted and second.steps == 8 and _steps(tmp_path) == [2, 4, 5]
    # run 3 resumes at step 5 with an interval of 0.7 s at 1 s per step: a checkpoint after every step
    third = _run(xp, device, checkpoint_every_seconds=0.7, callback=clock(1.0), resume=True, **ck)
    assert not third.interrupted and third.steps == 9 and _steps(tmp_path) == [2, 4, 5, 6, 7, 8, 9]
    assert _same(_host(third), _host(straight))
    assert _history(third) == _history(straight) and len(third.history) == 3


@pytest.mark.parametrize(
    "value, error, words",
    [
        (0, ValueError, "positive and finite, got 0"),
        (-5.0, ValueError, "positive and finite, got -5.0"),
        (math.nan, ValueError, "got nan"),
        (math.inf, ValueError, "got inf"),
        (datetime.timedelta(0), ValueError, "got datetime.timedelta(0)"),
        ("60", TypeError, "a number of seconds, got '60'"),
        (True, TypeError, "a number of seconds, got True"),
    ],
)
def test_bad_intervals_are_refused_before_anything_is_written(xp, device, tmp_path, value, error, words):
    ck = tmp_path / "ck"
    with pytest.raises(error, match="checkpoint_every_seconds") as info:
        _run(xp, device, checkpoint_path=ck, checkpoint_every_seconds=value)
    assert words in str(info.value) and "give a finite number of seconds > 0" in str(info.value)
    assert not ck.exists()


def test_an_interval_needs_a_directory(xp, device):
    with pytest.raises(ValueError, match=r"checkpoint_every_seconds=60\.0 needs checkpoint_path"):
        _run(xp, device, checkpoint_every_seconds=60)


def test_cli_checkpoint_every_seconds(backend, tmp_path, capsys, monkeypatch):
    """``geoarray train vit --out DIR --checkpoint-every-seconds S`` passes the interval to fit (the clock
    advanced by one second per call here: a checkpoint after every step at S = 1); a bad value, or the
    flag without --out, is one line and exit code 2."""
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")
    if backend.name != "numpy":
        pytest.skip("the CLI's flag handling is host code; the interval itself is checked on every backend above")
    from geoarray.cli import main

    ticks = iter(range(10**6))
    monkeypatch.setattr(train, "_monotonic", lambda: float(next(ticks)))
    small = ["train", "vit", "--limit", "64", "--n-layers", "1", "--batch-size", "32", "--no-progress", "--epochs", "1"]
    assert main([*small, "--out", str(tmp_path / "a"), "--checkpoint-every-seconds", "1"]) == 0
    assert _steps(tmp_path / "a" / "checkpoints") == [1, 2]  # 2 steps; keep=3
    capsys.readouterr()
    for bad in ("0", "-1", "nan", "inf", "soon"):
        assert main([*small, "--out", str(tmp_path / "b"), "--checkpoint-every-seconds", bad]) == 2
    assert main([*small, "--checkpoint-every-seconds", "60"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(line.startswith("geoarray train vit: error:") for line in err), err
    assert all("--checkpoint-every-seconds" in line for line in err) and "needs --out DIR" in err[-1]
    assert not (tmp_path / "b").exists()

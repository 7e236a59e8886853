"""The training loop: :func:`fit` runs any layer-contract model with any geoarray optimizer on any backend. In short::

    result = geoarray.train.fit(model, params, (x, y), geoarray.optim.Adam(lr=1e-3), loss,
                                epochs=10, batch_size=64, seed=0)
    result.params, result.opt_state, result.history, result.interrupted

Gradients come from the analytic pullbacks (``model.vjp`` + ``loss.vjp``, every backend, the only
choice on NumPy, CuPy and array-api-strict) or from the host framework's autodiff of
``loss.value(model.apply(params, x), y)`` (``torch.func.grad_and_value`` on PyTorch,
``jax.value_and_grad`` on JAX); the tests check that the two agree to 1e-10 in float64.

Mini-batches: each epoch draws a permutation of the samples on the host from
``numpy.random.SeedSequence(seed, spawn_key=(epoch,))`` (the generator behind :mod:`geoarray.random`),
moves the index array once to the data's device and takes the batches with ``xp.take``; the last
batch of an epoch may be smaller. The same seed gives the same batches, so a run is deterministic
for a seed on a deterministic backend.

Checkpoints (``checkpoint_path=DIR``, every ``checkpoint_every`` optimizer steps and/or once
``checkpoint_every_seconds`` have passed since the last one, or at the end of every epoch, and after
the last step): each is committed as one unit, ``DIR/ckpt-<step>`` holding
``params.npz``, ``opt_state.npz`` (:func:`geoarray.optim.save_state`), ``meta.json`` (epoch, batch
within the epoch, step, seed, history, the epoch's partial loss sum) and a manifest of their SHA-256
sums, written into a temporary directory, fsync-ed and renamed into place (:mod:`geoarray._checkpoints`).
A process killed at any moment leaves the previous checkpoints intact and never a torn one that loads.
``resume=True`` continues from the newest intact checkpoint: the batches of an epoch depend only on
(seed, epoch), the optimizer's randomness lives in its state, so the resumed run is bit-identical to an
uninterrupted one (``tests/test_checkpoint_crash.py`` kills a run at every file-system call of its
saves and checks this). :func:`load_checkpoint` reads a checkpoint back on the namespace and devices of
given ``like`` trees.

Ctrl-C: while :func:`fit` runs in the main thread, SIGINT sets a flag and the loop stops after the
step in progress (a second Ctrl-C interrupts at once). A ``KeyboardInterrupt`` raised inside a step
(from the model, the loss or a metric) abandons that step. Either way :func:`fit` returns the
parameters and state of the last completed step with ``interrupted=True``; the history holds the
completed epochs, the JSON file (``out=``) is written, and the last checkpoint is kept as it was.
"""

from __future__ import annotations

import datetime
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _backend, _io
from . import _train_args as _args
from ._checkpoints import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint

__all__ = [
    "FitResult",
    "accuracy",
    "fit",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
    "value_and_grad",
]

from ._typing import Array

_GRAD_MODES = ("auto", "analytic", "autodiff")


@dataclass
class FitResult:
    """What :func:`fit` returns.

    ``history`` has one dict per completed epoch: ``epoch`` (1-based), ``train_loss`` (the mean of the
    step losses weighted by batch size, before each step's update), ``val_loss`` (with ``val_data``),
    ``seconds`` (wall time of the epoch) and one entry per metric. ``interrupted`` is True when Ctrl-C
    (or a ``KeyboardInterrupt``) stopped the run; ``steps`` counts the optimizer steps taken;
    ``checkpoint`` is the directory of the last checkpoint written, or None.
    """

    params: Any
    opt_state: Any
    history: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    steps: int = 0
    checkpoint: str | None = None


# ---------------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------------


# fit holds at most _PENDING steps' losses on the device before it reads them to the host, and reads one
# for the progress bar at most once every _BAR_LOSS_SECONDS
_PENDING = 256
_BAR_LOSS_SECONDS = 1.0


def _monotonic() -> float:
    """The clock of ``checkpoint_every_seconds`` (a module function so that tests can replace it)."""
    return time.monotonic()


def _resolve_grad(grad: str, xp: Any) -> str:
    if grad not in _GRAD_MODES:
        raise ValueError(f"fit: grad must be one of {_GRAD_MODES}, got {grad!r}")
    native = _backend.has_autodiff(xp)
    if grad == "auto":
        return "autodiff" if native else "analytic"
    if grad == "autodiff" and not native:
        raise ValueError(
            f"fit: grad='autodiff' needs PyTorch or JAX arrays, got {_backend.backend_name(xp)}; use grad='analytic'"
        )
    return grad


# ---------------------------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------------------------


def value_and_grad(model: Any, loss: Any, params: Any, inputs: Array, targets: Array, *, grad: str = "auto"):
    """``(loss value, ∇_params loss)`` of ``loss.value(model.apply(params, inputs), targets)``.

    ``grad="analytic"`` chains ``model.vjp`` and ``loss.vjp`` (any backend); ``"autodiff"`` uses
    ``torch.func.grad_and_value`` or ``jax.value_and_grad`` of the same expression; ``"auto"`` picks
    autodiff on PyTorch and JAX. The gradient has the tree structure of ``params``.
    """
    xp = _backend.array_namespace(inputs=inputs, targets=targets)
    mode = _resolve_grad(grad, xp)
    if mode == "analytic":
        pred, pullback = model.vjp(params, inputs)
        value, loss_pullback = loss.vjp(pred, targets)
        grads, _ = pullback(loss_pullback(1.0))
        return value, grads

    def objective(p: Any) -> Array:
        return loss.value(model.apply(p, inputs), targets)

    return _backend.value_and_grad(objective, params, xp)


def _maybe_jit(fn: Callable[..., Any], xp: Any, enabled: bool) -> Callable[..., Any]:
    """``jax.jit(fn)`` on JAX, falling back to eager where tracing fails
    (:func:`geoarray._backend.jit_with_fallback`); ``fn`` itself elsewhere or when not ``enabled``."""
    return _backend.jit_with_fallback(fn, xp) if enabled else fn


def _to_float(value: Any) -> float:
    return float(_backend.to_host(value))


def _losses_to_host(values: list[Any], xp: Any) -> list[float]:
    """The host values of several 0-d loss arrays in one transfer (on a device, one synchronisation
    instead of one per value); each equals ``_to_float`` of its array exactly."""
    if len(values) == 1:
        return [_to_float(values[0])]
    host = _backend.to_host(xp.stack([xp.reshape(_backend.as_array(v), ()) for v in values]))
    return [float(v) for v in host]


# ---------------------------------------------------------------------------------------------
# Ctrl-C
# ---------------------------------------------------------------------------------------------


class _StopFlag:
    """SIGINT sets ``requested``; a second SIGINT raises KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(signal.SIGINT, self._handler)
                self._installed = True
            except ValueError:  # e.g. an embedded interpreter without signal support
                self._installed = False
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is in the `demo` extra; without it the loop runs silently
        return None
    return tqdm(total=total, unit="step", dynamic_ncols=True, leave=True)


# ---------------------------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------------------------


def fit(
    model: Any,
    params: Any,
    data: tuple[Array, Array],
    optimizer: Any,
    loss: Any,
    *,
    epochs: int,
    batch_size: int,
    seed: int = 0,
    manifolds: Any = None,
    val_data: tuple[Array, Array] | None = None,
    metrics: Mapping[str, Callable[[Any, Any, Array, Array], float]] | None = None,
    grad: str = "auto",
    out: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    checkpoint_every_seconds: float | datetime.timedelta | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    checkpoint_meta: Mapping[str, Any] | None = None,
    keep: int | None = 3,
    resume: bool = False,
    progress: bool = True,
    opt_state: Any = None,
    callback: Callable[[dict[str, Any]], None] | None = None,
    jit: bool = True,
) -> FitResult:
    """Train ``model`` from ``params`` on ``data = (inputs, targets)`` for ``epochs`` epochs.

    Each step takes a mini-batch of ``batch_size`` samples (sample axis first), computes the loss
    and its gradient (``grad``: ``"analytic"``, ``"autodiff"`` or ``"auto"``, see
    :func:`value_and_grad`) and calls ``optimizer.update`` with ``manifolds`` (default
    ``model.manifolds()``), so Stiefel weights stay on their manifold. After each epoch the loss on
    ``val_data`` and each ``metrics[name](model, params, val_inputs, val_targets)`` (on ``val_data``,
    required then) are recorded. ``out`` receives ``{"history": [...], "interrupted": bool,
    "steps": int}`` as JSON after every epoch. ``opt_state`` starts from a given optimizer state
    instead of ``optimizer.init``. ``callback(info)`` is called after every step with
    ``{"epoch", "step", "loss"}``. On JAX, ``jit=True`` compiles the gradient and the optimizer
    update with ``jax.jit`` (falling back to eager where tracing fails); other backends run eagerly.

    Host reads: the steps' losses stay on the device and are read in one transfer at the end of each
    epoch (and before a checkpoint, every 256 steps, and for the progress bar at most once a second),
    so on a GPU the loop does not wait for each step before queueing the next; a ``callback`` gets
    each step's loss as a float, which reads it (one synchronisation per step). The optimizer's own
    reads follow :func:`geoarray.set_host_reads`. The history is the same whenever the reads fall.

    Checkpoints: with ``checkpoint_path=DIR`` a checkpoint is committed every ``checkpoint_every``
    optimizer steps, after the first step that ends ``checkpoint_every_seconds`` (seconds or a
    ``datetime.timedelta``, on ``time.monotonic``) after the last checkpoint or the start of this call,
    whichever comes first when both are given (default: at the end of every epoch), and after the last
    step, keeping the ``keep`` newest (:func:`save_checkpoint`). ``resume=True`` continues from the
    newest intact checkpoint in DIR (skipping damaged ones with a warning) at its epoch and step, with
    the same batches, so the result is bit-identical to an uninterrupted run, wherever the checkpoints
    fell; ``params`` and ``opt_state`` (or ``optimizer.init``) then only give the layout, dtypes and
    devices; an empty DIR starts afresh. ``checkpoint_meta`` (a dict of JSON values, e.g. the
    configuration that built the model) is saved in every checkpoint's meta.json under
    ``"checkpoint_meta"``, for the caller to check before it resumes (:func:`load_checkpoint` returns
    it; ``geoarray train --resume`` names the flag that differs); ``fit`` stores it and compares nothing.
    Without ``resume`` a DIR that already holds checkpoints is refused. A save that the file system
    refuses raises its ``OSError`` (naming DIR; the previous checkpoint intact) with the result up to
    that step as the exception's ``fit_result``; so does a failing write of ``out``. See the module
    docstring for batches and Ctrl-C.
    """
    epochs = _args.positive_int(epochs, "epochs")
    batch_size = _args.positive_int(batch_size, "batch_size")
    checkpoint_every = _args.positive_int(checkpoint_every, "checkpoint_every", allow_none=True)
    checkpoint_every_seconds = _args.interval_seconds(checkpoint_every_seconds)
    keep = _args.positive_int(keep, "keep", allow_none=True)
    checkpoint_meta = _args.json_dict(checkpoint_meta, "checkpoint_meta")
    for name, value in (
        ("checkpoint_every", checkpoint_every),
        ("checkpoint_every_seconds", checkpoint_every_seconds),
        ("checkpoint_meta", checkpoint_meta),
    ):
        if value is not None and checkpoint_path is None:
            raise ValueError(f"fit: {name}={value!r} needs checkpoint_path (a directory); pass checkpoint_path=DIR")
    if not isinstance(resume, bool):
        raise TypeError(f"fit: resume must be True or False, got {resume!r}")
    progress, jit = _args.flag(progress, "progress"), _args.flag(jit, "jit")
    out = _args.path_arg(out, "out", "the JSON file of the history")
    if out is not None and os.path.isdir(out):
        raise ValueError(f"fit: out {out!r} is a directory; give the path of the JSON file to write")
    checkpoint_path = _args.path_arg(checkpoint_path, "checkpoint_path", "a directory")
    if callback is not None and not callable(callback):
        raise TypeError(f"fit: callback must be callable (it is called with a dict after every step), got {callback!r}")
    if metrics is not None and not isinstance(metrics, Mapping):
        raise TypeError(f"fit: metrics must be a dict from name to metric function, got {metrics!r}")
    if resume and checkpoint_path is None:
        raise ValueError("fit: resume=True needs checkpoint_path (the directory of the run's checkpoints)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"fit: seed must be a non-negative int, got {seed!r}")
    inputs, targets, xp, n = _args.check_pair(data, "data")
    mode = _resolve_grad(grad, xp)
    if val_data is not None:
        val_inputs, val_targets, _, _ = _args.check_pair(val_data, "val_data")
    metrics = dict(metrics or {})
    if metrics and val_data is None:
        raise ValueError(f"fit: metrics {sorted(metrics)} are evaluated on val_data, which is None")
    for name, fn in metrics.items():
        if not isinstance(name, str):
            raise TypeError(f"fit: metrics' names must be strings (they key the history), got {name!r}")
        if not callable(fn):
            raise TypeError(f"fit: metrics[{name!r}] must be callable, got {type(fn).__name__}")
    if checkpoint_path is not None:
        checkpoint_path = _check_checkpoint_dir(checkpoint_path, resume)
    if manifolds is None:
        manifolds = model.manifolds()
    # init records the manifolds and grouping on the optimizer even when a saved state is resumed
    state = optimizer.init(params, manifolds)
    if opt_state is not None:
        state = opt_state
    if checkpoint_path is not None:  # a state that cannot be saved fails now, not after the first epoch
        from .optim.state import state_arrays

        state_arrays(state)
    run = {"seed": int(seed), "batch_size": batch_size, "n_samples": n}
    n_batches = math.ceil(n / batch_size)
    history: list[dict[str, Any]] = []
    result = FitResult(params=params, opt_state=state, history=history)
    # where the loop starts: epoch (1-based), batch within it, and that epoch's partial sums
    start, partial = (1, 0), {"loss_sum": 0.0, "samples": 0, "seconds": 0.0}
    if resume:
        assert checkpoint_path is not None  # resume needs it (checked above)
        resumed = _resume(checkpoint_path, params, state, run)
        if resumed is not None:
            result.params, result.opt_state, meta, result.checkpoint = resumed
            history.extend(meta["history"])
            result.steps = int(meta["steps"])
            start, partial = (int(meta["epoch"]) + 1, int(meta["batch"])), dict(meta["partial"])

    grad_fn = _maybe_jit(lambda p, xb, yb: value_and_grad(model, loss, p, xb, yb, grad=mode), xp, bool(jit))
    update_fn = _maybe_jit(optimizer.update, xp, bool(jit))
    dev = _backend.device(inputs)
    # the batches are taken with indices made on dev (committed, on JAX): the carried values go there
    # too, or every jitted function compiles twice (_backend.commit_to)
    result.params, result.opt_state = _backend.commit_to((result.params, result.opt_state), xp, dev)
    done = (start[0] - 1) * n_batches + start[1]
    bar = _progress_bar(max(epochs * n_batches - done, 0), progress)

    def write_out() -> None:
        if out is not None:
            try:
                _io.write_json(out, {"history": history, "interrupted": result.interrupted, "steps": result.steps})
            except OSError as exc:
                # fit's documented addition to the OSError (which declares no such attribute)
                setattr(exc, "fit_result", result)  # noqa: B010
                raise

    def checkpoint(epoch_done: int, batch: int, loss_sum: float, samples: int, seconds: float) -> None:
        meta = {
            **run,
            "epoch": epoch_done,
            "batch": batch,
            "steps": result.steps,
            "history": history,
            "partial": {"loss_sum": loss_sum, "samples": samples, "seconds": seconds},
        }
        if checkpoint_meta is not None:
            meta["checkpoint_meta"] = checkpoint_meta
        # called only with checkpoint_path (due() needs a checkpoint_every, which needs checkpoint_path)
        assert checkpoint_path is not None
        try:
            result.checkpoint = save_checkpoint(
                checkpoint_path, result.params, result.opt_state, meta, step=result.steps, keep=keep
            )
            last_saved[0] = _monotonic()
        except OSError as exc:
            # fit's documented addition to the OSError (which declares no such attribute)
            setattr(exc, "fit_result", result)  # noqa: B010
            try:
                write_out()
            except OSError:
                pass  # the checkpoint's error is the one to report
            raise

    last_saved = [_monotonic()]  # when the last checkpoint was committed (or this call started)
    shown = [-math.inf]  # when the progress bar last showed a loss

    def due() -> bool:
        if checkpoint_every is not None and result.steps % checkpoint_every == 0:
            return True
        return checkpoint_every_seconds is not None and _monotonic() - last_saved[0] >= checkpoint_every_seconds

    # A step's loss stays on the device until it is needed (the epoch's mean, a checkpoint, the
    # callback, the bar's display at most once a second, or _PENDING steps): a read after every step
    # would stall a GPU's queue once per step. The host adds the same floats in the same order
    # whenever they are read, so the history does not depend on when.
    pending: list[tuple[Any, int]] = []  # (loss, batch size) of the steps not read yet
    total = 0.0  # the epoch's loss sum over the steps read so far
    last = math.nan  # the loss of the last step read

    def read_pending() -> float:
        """Adds the pending losses to ``total`` in step order; the last step's loss."""
        nonlocal total, last
        if pending:
            values = _losses_to_host([v for v, _ in pending], xp)
            for value, (_, m) in zip(values, pending, strict=True):
                total += value * m
            pending.clear()
            last = values[-1]
        return last

    try:
        with _StopFlag() as stop:
            for epoch in range(start[0], epochs + 1):
                first = start[1] if epoch == start[0] else 0
                carried = partial if epoch == start[0] else {"loss_sum": 0.0, "samples": 0, "seconds": 0.0}
                t0 = time.perf_counter() - float(carried["seconds"])
                rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(epoch,)))
                perm = xp.asarray(rng.permutation(n), device=dev)
                total, seen = float(carried["loss_sum"]), int(carried["samples"])
                for b in range(first, n_batches):
                    # min(): array-api-strict refuses slices that run past the end
                    idx = perm[b * batch_size : min((b + 1) * batch_size, n)]
                    xb = xp.take(inputs, idx, axis=0)
                    yb = xp.take(targets, idx, axis=0)
                    value, grads = grad_fn(result.params, xb, yb)
                    result.params, result.opt_state = update_fn(result.params, grads, result.opt_state)
                    result.steps += 1
                    m = int(idx.shape[0])
                    pending.append((value, m))
                    seen += m
                    if bar is not None:
                        bar.update(1)
                        if time.perf_counter() - shown[0] >= _BAR_LOSS_SECONDS:
                            # the epoch's mean so far, the number its history records at its end (a
                            # single batch's loss is noisier and disagreed with the printed table)
                            read_pending()
                            bar.set_postfix(epoch=epoch, loss=f"{total / seen:.4f}", refresh=False)
                            shown[0] = time.perf_counter()
                    if callback is not None:
                        callback({"epoch": epoch, "step": result.steps, "loss": read_pending()})
                    if len(pending) >= _PENDING:
                        read_pending()
                    if b < n_batches - 1 and due():
                        read_pending()
                        checkpoint(epoch - 1, b + 1, total, seen, time.perf_counter() - t0)
                    if stop.requested:
                        raise KeyboardInterrupt
                read_pending()
                record: dict[str, Any] = {"epoch": epoch, "train_loss": total / seen}
                if val_data is not None:
                    record["val_loss"] = _to_float(loss.value(model.apply(result.params, val_inputs), val_targets))
                for name, fn in metrics.items():
                    record[name] = float(fn(model, result.params, val_inputs, val_targets))
                record["seconds"] = time.perf_counter() - t0
                history.append(record)
                if bar is not None:
                    bar.set_postfix(epoch=epoch, loss=f"{record['train_loss']:.4f}")
                write_out()
                periodic = checkpoint_every is not None or checkpoint_every_seconds is not None
                if checkpoint_path is not None and (not periodic or due() or epoch == epochs):
                    checkpoint(epoch, 0, 0.0, 0, 0.0)
    except KeyboardInterrupt:
        result.interrupted = True
        write_out()
    finally:
        if bar is not None:
            bar.close()
    return result


def _check_checkpoint_dir(path: Any, resume: bool) -> str:
    """The checkpoint directory, created and checked before any training: a file there, a directory
    that cannot be written, or (without ``resume``) earlier checkpoints are refused at once."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"fit: checkpoint_path {path!r} is a file; give a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, f"fit: cannot create checkpoint_path {path!r}: {exc.strerror}", path) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(13, f"fit: checkpoint_path {path!r} is not writable", path)
    if not resume and list_checkpoints(path):
        raise ValueError(
            f"fit: checkpoint_path {path!r} already holds checkpoints (newest {latest_checkpoint(path)!r}); "
            "pass resume=True to continue that run, or choose an empty directory"
        )
    return path


def _resume(path: str, like_params: Any, like_state: Any, run: dict) -> tuple[Any, Any, dict, str] | None:
    """The newest intact checkpoint of ``path`` checked against this run's seed, batch size and sample
    count (other batches would not continue the run), or None when ``path`` holds none. Newer damaged
    checkpoints are renamed ``damaged-ckpt-…`` (kept for inspection) so that the run can overwrite their steps."""
    from ._checkpoints import _load

    if not list_checkpoints(path):
        return None
    params, state, meta, ckpt = _load(path, like_params, like_state, fallback=True)
    for key in ("seed", "batch_size", "n_samples", "epoch", "batch", "steps", "history", "partial"):
        if key not in meta:
            raise ValueError(f"fit: {ckpt!r} was not written by geoarray.train.fit (its meta.json has no {key!r})")
    for key, value in run.items():
        if meta[key] != value:
            raise ValueError(
                f"fit: {ckpt!r} belongs to a run with {key}={meta[key]!r}, this one has {key}={value!r}; resuming "
                f"would not continue that run (use the same {key}, or another checkpoint_path)"
            )
    for step, newer in list_checkpoints(path):
        if step > int(meta["steps"]):
            aside, n = os.path.join(path, "damaged-" + os.path.basename(newer)), 1
            while os.path.lexists(aside):  # the same step damaged again in an earlier resume
                aside, n = os.path.join(path, f"damaged-{os.path.basename(newer)}-{n}"), n + 1
            os.replace(newer, aside)
    return params, state, meta, ckpt


def accuracy(model: Any, params: Any, inputs: Array, targets: Array) -> float:
    """Fraction of samples whose predicted class (argmax of the model output) is the target class.

    ``targets`` are one-hot (or probability) rows (..., C) or integer labels (...,). Usable as a
    :func:`fit` metric: ``metrics={"accuracy": geoarray.train.accuracy}``.
    """
    xp = _backend.array_namespace(inputs=inputs, targets=targets)
    pred = xp.argmax(model.apply(params, inputs), axis=-1)
    labels = targets if xp.isdtype(targets.dtype, "integral") else xp.argmax(targets, axis=-1)
    correct = xp.sum(xp.astype(pred == xp.astype(labels, pred.dtype), xp.int32))
    return int(_backend.to_host(correct)) / max(1, math.prod(pred.shape))

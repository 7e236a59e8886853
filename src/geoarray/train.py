"""The training loop: :func:`fit` runs any layer-contract model with any geoarray optimizer on any backend.

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

Checkpoints (``checkpoint_every=k``, ``checkpoint_path=DIR``): every k epochs the directory receives
``opt_state.npz`` (:func:`geoarray.optim.save_state`), ``params.npz`` (the parameter leaves written by
the same mechanism: host copies in an ``.npz`` archive, bit-exact, with the tree layout checked on
load) and ``meta.json`` (epoch, seed, history). Each file is written to a temporary name and renamed,
so an interruption during a save leaves the previous checkpoint intact. :func:`load_checkpoint` reads
it back on the namespace and devices of given ``like`` trees.

Ctrl-C: while :func:`fit` runs in the main thread, SIGINT sets a flag and the loop stops after the
step in progress (a second Ctrl-C interrupts at once). A ``KeyboardInterrupt`` raised inside a step
(from the model, the loss or a metric) abandons that step. Either way :func:`fit` returns the
parameters and state of the last completed step with ``interrupted=True``; the history holds the
completed epochs, the JSON file (``out=``) is written, and the last checkpoint is kept as it was.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optree

from . import _backend

__all__ = ["FitResult", "accuracy", "fit", "load_checkpoint", "save_checkpoint", "value_and_grad"]

Array = Any

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


def _positive_int(value: Any, name: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"fit: {name} must be a positive int, got {value!r}")
    return int(value)


def _check_pair(data: Any, name: str) -> tuple[Array, Array, Any, int]:
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"fit: {name} must be a pair (inputs, targets), got {type(data).__name__}")
    inputs, targets = data
    xp = _backend.array_namespace(**{f"{name}[0]": inputs, f"{name}[1]": targets})
    if inputs.ndim < 1 or targets.ndim < 1:
        raise ValueError(f"fit: {name} arrays need a sample axis first, got shapes {inputs.shape} and {targets.shape}")
    n = inputs.shape[0]
    if targets.shape[0] != n:
        raise ValueError(
            f"fit: {name} inputs and targets must have the same number of samples (axis 0), "
            f"got {inputs.shape[0]} and {targets.shape[0]}"
        )
    if n < 1:
        raise ValueError(f"fit: {name} holds no samples")
    return inputs, targets, xp, int(n)


def _resolve_grad(grad: str, xp: Any) -> str:
    if grad not in _GRAD_MODES:
        raise ValueError(f"fit: grad must be one of {_GRAD_MODES}, got {grad!r}")
    native = _backend.is_torch(xp) or _backend.is_jax(xp)
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

    if _backend.is_torch(xp):
        import torch.func

        grads, value = torch.func.grad_and_value(objective)(params)
        return value, grads
    import jax

    value, grads = jax.value_and_grad(objective)(params)
    return value, grads


def _maybe_jit(fn: Callable[..., Any], xp: Any, enabled: bool) -> Callable[..., Any]:
    """``jax.jit(fn)`` on JAX (eager JAX dispatches every small op: a ViT step is ~40× slower), else ``fn``.

    If tracing fails (a model or optimizer with Python control flow on array values, or
    ``section="random"``, which draws on the host), the call is repeated eagerly and ``fn`` is used
    from then on.
    """
    if not (enabled and _backend.is_jax(xp)):
        return fn
    import jax

    current = [jax.jit(fn)]

    def call(*args: Any) -> Any:
        if current[0] is not fn:
            try:
                return current[0](*args)
            except TypeError:  # jax's ConcretizationTypeError and friends are TypeErrors
                current[0] = fn
        return fn(*args)

    return call


def _to_float(value: Any) -> float:
    return float(_backend.to_host(value))


# ---------------------------------------------------------------------------------------------
# checkpoints and JSON
# ---------------------------------------------------------------------------------------------


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_json(path: str | os.PathLike, obj: Any) -> None:
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")

    _atomic_write(path, write)


def _params_layout(params: Any) -> str:
    leaves, treedef = optree.tree_flatten(params)
    return json.dumps({"tree": repr(treedef), "shapes": [list(leaf.shape) for leaf in leaves]})


def save_checkpoint(path: str | os.PathLike, params: Any, opt_state: Any, meta: Mapping[str, Any] | None = None) -> str:
    """Write ``params``, ``opt_state`` and ``meta`` into the directory ``path`` (created if needed).

    ``opt_state.npz`` by :func:`geoarray.optim.save_state`; ``params.npz`` holds host copies of the
    parameter leaves (the mechanism ``save_state`` uses, bit-exact) plus the tree layout;
    ``meta.json`` holds ``meta``. Every file is replaced atomically. Returns the directory.
    """
    from .optim import save_state

    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    leaves = optree.tree_leaves(params)
    arrays = {f"leaf_{i:05d}": _backend.to_host(leaf) for i, leaf in enumerate(leaves)}
    arrays["__layout__"] = np.array(_params_layout(params))

    def write_params(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    _atomic_write(os.path.join(path, "params.npz"), write_params)
    _atomic_write(os.path.join(path, "opt_state.npz"), lambda tmp: save_state(tmp, opt_state))
    _write_json(os.path.join(path, "meta.json"), dict(meta or {}))
    return path


def load_checkpoint(path: str | os.PathLike, *, like_params: Any, like_state: Any) -> tuple[Any, Any, dict]:
    """``(params, opt_state, meta)`` from a directory written by :func:`save_checkpoint`.

    The arrays are placed on the namespace, dtypes and devices of ``like_params`` / ``like_state``
    (e.g. ``model.init(...)`` and ``optimizer.init(...)``); a different layout raises ``ValueError``.
    """
    from .optim import load_state

    path = os.fspath(path)
    pfile = os.path.join(path, "params.npz")
    if not os.path.isfile(pfile):
        raise ValueError(f"load_checkpoint: {pfile!r} does not exist")
    leaves, treedef = optree.tree_flatten(like_params)
    with np.load(pfile, allow_pickle=False) as data:
        layout = str(data["__layout__"]) if "__layout__" in data else None
        if layout != _params_layout(like_params):
            raise ValueError(f"load_checkpoint: {pfile!r} holds parameters of a different layout than like_params")
        host = [data[f"leaf_{i:05d}"] for i in range(len(leaves))]
    # like_params' memory layout too: on torch a column-major weight restored row-major would round differently
    params = optree.tree_unflatten(
        treedef, [_backend.from_host_like(h, ref) for h, ref in zip(host, leaves, strict=True)]
    )
    opt_state = load_state(os.path.join(path, "opt_state.npz"), like=like_state)
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as fh:
        meta = json.load(fh)
    return params, opt_state, meta


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
    checkpoint_path: str | os.PathLike | None = None,
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
    "steps": int}`` as JSON after every epoch. ``opt_state`` resumes from a given optimizer state
    instead of ``optimizer.init``. ``callback(info)`` is called after every step with
    ``{"epoch", "step", "loss"}``. On JAX, ``jit=True`` compiles the gradient and the optimizer
    update with ``jax.jit`` (falling back to eager where tracing fails); other backends run eagerly.
    See the module docstring for batches, checkpoints and Ctrl-C.
    """
    epochs = _positive_int(epochs, "epochs")
    batch_size = _positive_int(batch_size, "batch_size")
    checkpoint_every = _positive_int(checkpoint_every, "checkpoint_every", allow_none=True)
    if checkpoint_every is not None and checkpoint_path is None:
        raise ValueError("fit: checkpoint_every needs checkpoint_path (a directory)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"fit: seed must be a non-negative int, got {seed!r}")
    inputs, targets, xp, n = _check_pair(data, "data")
    mode = _resolve_grad(grad, xp)
    if val_data is not None:
        val_inputs, val_targets, _, _ = _check_pair(val_data, "val_data")
    metrics = dict(metrics or {})
    if metrics and val_data is None:
        raise ValueError(f"fit: metrics {sorted(metrics)} are evaluated on val_data, which is None")
    for name, fn in metrics.items():
        if not callable(fn):
            raise TypeError(f"fit: metrics[{name!r}] must be callable, got {type(fn).__name__}")
    if manifolds is None:
        manifolds = model.manifolds()
    # init records the manifolds and grouping on the optimizer even when a saved state is resumed
    state = optimizer.init(params, manifolds)
    if opt_state is not None:
        state = opt_state

    grad_fn = _maybe_jit(lambda p, xb, yb: value_and_grad(model, loss, p, xb, yb, grad=mode), xp, bool(jit))
    update_fn = _maybe_jit(optimizer.update, xp, bool(jit))
    dev = _backend.device(inputs)
    n_batches = math.ceil(n / batch_size)
    history: list[dict[str, Any]] = []
    result = FitResult(params=params, opt_state=state, history=history)
    bar = _progress_bar(epochs * n_batches, progress)

    def write_out() -> None:
        if out is not None:
            _write_json(out, {"history": history, "interrupted": result.interrupted, "steps": result.steps})

    try:
        with _StopFlag() as stop:
            for epoch in range(1, epochs + 1):
                t0 = time.perf_counter()
                rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(epoch,)))
                perm = xp.asarray(rng.permutation(n), device=dev)
                total, seen = 0.0, 0
                for b in range(n_batches):
                    # min(): array-api-strict refuses slices that run past the end
                    idx = perm[b * batch_size : min((b + 1) * batch_size, n)]
                    xb = xp.take(inputs, idx, axis=0)
                    yb = xp.take(targets, idx, axis=0)
                    value, grads = grad_fn(result.params, xb, yb)
                    new_params, new_state = update_fn(result.params, grads, result.opt_state)
                    value = _to_float(value)
                    result.params, result.opt_state = new_params, new_state
                    result.steps += 1
                    m = int(idx.shape[0])
                    total += value * m
                    seen += m
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(epoch=epoch, loss=f"{value:.4f}", refresh=False)
                    if callback is not None:
                        callback({"epoch": epoch, "step": result.steps, "loss": value})
                    if stop.requested:
                        raise KeyboardInterrupt
                record: dict[str, Any] = {"epoch": epoch, "train_loss": total / seen}
                if val_data is not None:
                    record["val_loss"] = _to_float(loss.value(model.apply(result.params, val_inputs), val_targets))
                for name, fn in metrics.items():
                    record[name] = float(fn(model, result.params, val_inputs, val_targets))
                record["seconds"] = time.perf_counter() - t0
                history.append(record)
                write_out()
                if checkpoint_every is not None and epoch % checkpoint_every == 0:
                    meta = {"epoch": epoch, "seed": int(seed), "steps": result.steps, "history": history}
                    result.checkpoint = save_checkpoint(checkpoint_path, result.params, result.opt_state, meta)
    except KeyboardInterrupt:
        result.interrupted = True
        write_out()
    finally:
        if bar is not None:
            bar.close()
    return result


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

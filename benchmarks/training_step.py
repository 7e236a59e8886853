"""A full training step (forward, backward, update) of the ViT with Stiefel-Adam against Euclidean Adam.

    PYTHONPATH=src python benchmarks/training_step.py [--backends torch numpy jax cupy] [--model digits|paper]
        [--steps 30] [--batch-size 64] [--n-layers L] [--dtype float32] [--threads 2]
        [--torch-grad autograd|analytic] [--profile K] [--no-peers] [--device cpu|cuda] [--capture] [--tf32]
        [--json out.json]

The network is the vision transformer of ``geoarray demo`` / ``geoarray train vit`` (Brantner,
*Generalizing Adam to Manifolds for Efficiently Training Transformers*; no layer norm, the paper's L2
loss): ``--model digits`` is the demo's configuration (scikit-learn's 8×8 digits in 4 patches of 4×4,
4 heads, 8 blocks: 96 projections on Stiefel(16, 4)); ``--model paper`` is the paper's MNIST
configuration (16 patches of 7×7, 7 heads, 16 blocks: 336 projections on Stiefel(49, 7)) on synthetic
images of that shape (MNIST is not downloaded; the step's cost does not depend on the pixel values), with
labels drawn among the classes the initial network does not predict (it saturates at initialisation, and
where its one-hot output equals the label, autodiff of the L2 loss is NaN; the script counts batches with
non-finite gradients, untimed, and warns).

Every backend runs the same network from the same initial weights, once with the Q/K/V projections on
the Stiefel manifold and geoarray's manifold Adam, once unconstrained with the backend's Euclidean Adam
(β = (0.9, 0.99), lr 1e-3), as a user of that backend would write the step:

* **torch** — ``geoarray.torch.nn.Module(ClassificationTransformer(...))``, loss
  ``nn.ClassificationL2Loss().value``, ``loss.backward()`` (torch autograd; ``--torch-grad analytic``: the
  layers' analytic pullbacks inside autograd, ``Module(..., analytic=True)``), then ``opt.step()`` with
  ``geoarray.torch.PaperAdam`` (ManifoldParameters: Stiefel-Adam, the paper's variant) or
  ``torch.optim.Adam`` (default foreach implementation) on plain parameters. Also shown:
  ``geoarray.torch.PaperAdam`` on the plain parameters (geoarray's own Euclidean Adam) and, when
  installed, geoopt's ``RiemannianAdam`` on ``geoopt.ManifoldParameter(..., geoopt.Stiefel())`` (its
  default, canonical metric). With ``--capture`` (``--device cuda``): the whole step — forward, backward
  and ``opt.step()`` — captured in one CUDA graph and replayed on each new batch (torch's whole-network
  capture), with ``geoarray.torch.PaperAdam(capturable=True)`` and ``torch.optim.Adam(capturable=True)``;
  a capture that fails is reported with its error instead of a time. On CUDA the script also lists every
  host synchronisation of eager steps (forward and backward alone, and the whole step) with its site, under
  ``torch.cuda.set_sync_debug_mode("warn")``; float32 products are full float32 on torch and JAX unless
  ``--tf32``. Not yet run on a GPU.
* **numpy** — the library's analytic pullbacks (``geoarray.train.value_and_grad(..., grad="analytic")``,
  i.e. ``model.vjp`` + ``loss.vjp``) and ``geoarray.optim.Adam(group_same_shape=True)`` as
  ``geoarray train vit`` uses it, with ``model.manifolds()`` (Stiefel) or no manifolds (Euclidean: the
  same code minus the manifold).
* **cupy** (on request, always on the GPU) — the numpy step above on CuPy arrays, the same code, with the
  device synchronised at the end of each step. Not yet run on a GPU.
* **jax** — ``geoarray.jax.make_train_step`` (``jax.value_and_grad`` + update under one ``jax.jit``)
  with ``geoarray.optim.Adam`` and the manifolds, against the same with ``optax.adam``; the first call
  (tracing and XLA compilation) is reported separately.

"fwd+bwd" is the forward and backward pass alone (no update), so step − fwd+bwd is the update's share.
Method: each step function runs 3 warm-up steps, then ``--steps`` rounds call every function once,
interleaved in alternating order (load from other processes on a shared machine hits all alike), each
on its own copy of the weights and cycling through the same 8 mini-batches; the tables give medians.
Ratios are what carries over between machines; the issue's target is Stiefel / Euclidean ≤ 1.15×
(Brantner's paper measured 1.03× on CPU).

Latest measurement (main ``c577f85``, batch 64, float32, median of 30, every library on one thread; AMD
EPYC Zen 4, 2 vCPUs shared with other jobs, load average 0.4–1.1; torch 2.13.0+cpu, jax 0.10.2, numpy
2.4.6), Stiefel / Euclid over six runs (torch, NumPy; JAX two):

=================  ==============================  ===========================
backend            ``--model digits``              ``--model paper`` (3 × 20)
=================  ==============================  ===========================
torch, 1 thread    1.09–1.15× (median 1.11×)       1.01–1.04×
numpy (analytic)   1.20–1.22×                      1.03–1.06×
jax (jit)          0.97–1.06×                      —
=================  ==============================  ===========================

Absolute times, the previous main run alongside, a profile and the machine: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np
import optree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import cuda_sync_sites, format_sync_sites, interleaved_medians, machine_info

import geoarray
from geoarray import nn, optim
from geoarray.models import ClassificationTransformer

BACKENDS = ("torch", "numpy", "jax")  # the default; cupy (a GPU) on request
CONFIGS = {
    # the demo's: digits 8×8 in 4×4 patches, patch size heads, 8 blocks (geoarray/commands/vit.py)
    "digits": {"patch_dim": 16, "n_patches": 4, "n_heads": 4, "n_layers": 8},
    # the paper's MNIST ViT: 28×28 in 7×7 patches, 7 heads, 16 blocks (336 Stiefel(49, 7) projections)
    "paper": {"patch_dim": 49, "n_patches": 16, "n_heads": 7, "n_layers": 16},
}
LR = 1e-3
N_BATCHES = 8
COLUMNS = {  # key in the timings -> column title
    "fwd_bwd": "fwd+bwd",
    "euclidean": "Euclid Adam",
    "geoarray_euclidean": "ga Euclid",
    "stiefel": "Stiefel-Adam",
    "geoopt": "geoopt",
    "euclidean_graph": "Euclid graph",
    "stiefel_graph": "Stiefel graph",
}


def _graph_step(torch, m, opt, batches, loss):
    """The training step (forward, backward, update) captured in one CUDA graph, as torch's whole-network
    capture recipe does: three warm-up steps on a side stream (the first builds the optimizer's state),
    the capture with static input tensors, then each call copies the next batch into them and replays."""
    next_batch = _cycle(batches)
    x0, y0 = next_batch()
    static_x, static_y = x0.clone(), y0.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss.value(m(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        value = loss.value(m(static_x), static_y)
        value.backward()
        opt.step()

    def step():
        x, y = next_batch()
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        torch.cuda.synchronize()
        return value

    return step


def transformer(config: dict, *, stiefel: bool) -> ClassificationTransformer:
    return ClassificationTransformer(
        config["patch_dim"],
        config["n_patches"],
        10,
        n_heads=config["n_heads"],
        n_layers=config["n_layers"],
        stiefel=stiefel,
        add_connection=True,  # the model benchmarks/README's timings were measured with
    )


def host_batches(model: str, config: dict, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``N_BATCHES`` mini-batches (x (B, T, d), one-hot y (B, 10)) as float64 NumPy arrays."""
    if model == "digits":
        from geoarray.data import images

        x, labels = images.load_digits(dtype="float64")
        (x_train, l_train), _ = images.train_test_split(x, labels, test_fraction=0.25, seed=0)
        xs = np.asarray(images.patches(x_train, 4))
        ys = np.asarray(images.one_hot(l_train, 10, dtype="float64"))
        reps = math.ceil(N_BATCHES * batch_size / xs.shape[0])
        xs, ys = np.concatenate([xs] * reps), np.concatenate([ys] * reps)
    else:
        rng = np.random.default_rng(0)
        n = N_BATCHES * batch_size
        xs = rng.random((n, config["n_patches"], config["patch_dim"]))
        # the deep ViT without layer norm saturates at initialisation: its softmax output is exactly one-hot
        # for many samples, and where that matches the label (p = t) autodiff of the L2 loss ‖p − t‖ is
        # 0·∞ = NaN. Random labels among the classes the initial network does not predict keep p ≠ t.
        import array_api_compat.numpy as xp

        model = transformer(config, stiefel=True)
        predicted = np.argmax(np.asarray(model.apply(model.init(0, xp=xp, dtype="float64"), xs)), axis=-1)
        ys = np.eye(10)[(predicted + rng.integers(1, 10, n)) % 10]
    return [
        (np.ascontiguousarray(xs[i * batch_size : (i + 1) * batch_size]), ys[i * batch_size : (i + 1) * batch_size])
        for i in range(N_BATCHES)
    ]


def _cycle(batches):
    box = [0]

    def next_batch():
        b = batches[box[0] % len(batches)]
        box[0] += 1
        return b

    return next_batch


# -- torch ---------------------------------------------------------------------------------------------


def bench_torch(config: dict, batches_np, args) -> dict[str, Any]:
    import torch

    import geoarray.torch as gt

    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("training_step.py: --device cuda but torch sees no CUDA GPU")
    if args.capture and device.type != "cuda":
        raise SystemExit(f"training_step.py: --capture needs --device cuda (CUDA graphs), got --device {args.device}")
    batches = [
        (torch.as_tensor(x, dtype=dtype, device=device), torch.as_tensor(y, dtype=dtype, device=device))
        for x, y in batches_np
    ]
    model_s, model_e = transformer(config, stiefel=True), transformer(config, stiefel=False)
    params = model_s.init(0, xp=geoarray.as_namespace(torch), dtype=dtype, device=device)
    # a GPU runs asynchronously: each timed step waits for its own work (interleaved_medians times calls)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    loss = nn.ClassificationL2Loss()

    def module(model):  # its own copy of the weights (Module shares the storage of params)
        copy = optree.tree_map(lambda t: t.detach().clone(), params)
        return gt.nn.Module(model, params=copy, analytic=args.torch_grad == "analytic")

    def make_step(m, opt, wait=True):
        next_batch = _cycle(batches)

        def step():
            x, y = next_batch()
            (opt or m).zero_grad()
            value = loss.value(m(x), y)
            value.backward()
            if opt is not None:
                opt.step()
            if wait:
                sync()
            return value

        return step

    fns, modules = {}, {}
    modules["fwd_bwd"] = m = module(model_e)
    fns["fwd_bwd"] = make_step(m, None)
    modules["euclidean"] = m = module(model_e)
    fns["euclidean"] = make_step(m, torch.optim.Adam(m.parameters(), lr=LR, betas=(0.9, 0.99)))
    if args.peers:
        modules["geoarray_euclidean"] = m = module(model_e)
        fns["geoarray_euclidean"] = make_step(m, gt.PaperAdam(m.parameters(), lr=LR))
    modules["stiefel"] = m = module(model_s)
    fns["stiefel"] = make_step(m, gt.PaperAdam(m.parameters(), lr=LR))
    notes = {
        "stiefel": "geoarray.torch.PaperAdam on ManifoldParameters",
        "euclidean": "torch.optim.Adam (foreach)",
        "fwd_bwd": "torch autograd"
        if args.torch_grad == "autograd"
        else "analytic pullbacks inside autograd (geoarray.torch.nn.Module(..., analytic=True))",
    }
    if args.capture:
        graphs = {
            "euclidean_graph": (
                model_e,
                lambda m: torch.optim.Adam(m.parameters(), lr=LR, betas=(0.9, 0.99), capturable=True),
                "torch.optim.Adam(capturable=True): forward, backward and step in one CUDA graph",
            ),
            "stiefel_graph": (
                model_s,
                lambda m: gt.PaperAdam(m.parameters(), lr=LR, capturable=True),
                "geoarray.torch.PaperAdam(capturable=True): forward, backward and step in one CUDA graph",
            ),
        }
        for key, (model, make_opt, note) in graphs.items():
            m = module(model)
            try:
                fns[key] = _graph_step(torch, m, make_opt(m), batches, loss)
            except Exception as exc:  # reported in the table instead of a time
                notes[key] = f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                continue
            modules[key] = m
            notes[key] = note
    try:
        import geoopt
    except ImportError:
        geoopt = None
        notes["geoopt"] = "geoopt not installed: pip install geoopt to compare"
    if geoopt is not None and args.peers:
        m = module(model_s)
        for name, p in list(m.named_parameters()):
            if isinstance(p, gt.ManifoldParameter):
                owner, _, leaf = name.rpartition(".")
                m.get_submodule(owner).register_parameter(
                    leaf, geoopt.ManifoldParameter(p.detach().clone(), manifold=geoopt.Stiefel())
                )
        modules["geoopt"] = m
        fns["geoopt"] = make_step(m, geoopt.optim.RiemannianAdam(m.parameters(), lr=LR, betas=(0.9, 0.99)))
        notes["geoopt"] = f"geoopt {geoopt.__version__} RiemannianAdam, Stiefel (canonical)"
    syncs = {}
    if device.type == "cuda":  # where an eager step (forward, backward, update) makes the host wait
        for key, model in (("euclidean", model_e), ("stiefel", model_s)):
            syncs[f"{key}_fwd_bwd"] = format_sync_sites(cuda_sync_sites(torch, make_step(module(model), None, False)))
            m = module(model)
            opt = torch.optim.Adam(m.parameters(), lr=LR, betas=(0.9, 0.99)) if key == "euclidean" else None
            opt = opt or gt.PaperAdam(m.parameters(), lr=LR)
            syncs[f"{key}_step"] = format_sync_sites(cuda_sync_sites(torch, make_step(m, opt, False), repeats=3))
        for key, value in syncs.items():
            print(f"  host waits in an eager {key.replace('_', ' ')} (torch.cuda sync debug mode): {value}", flush=True)
    medians = interleaved_medians(fns, args.steps, warmup=args.warmup)
    profile = _profile_torch(fns, args.profile) if args.profile else None
    # not timed: batches whose autograd gradient (initial weights) is not finite, where the optimizers skip
    # (geoarray) or propagate NaN (torch, geoopt) and the step is not the one meant to be timed
    bad = 0
    probe = module(model_s)
    for x, y in batches:
        probe.zero_grad()
        loss.value(probe(x), y).backward()
        bad += any(not bool(torch.isfinite(p.grad).all()) for p in probe.parameters())
    with torch.no_grad():
        tree = modules["stiefel"].param_tree()
        drift = _orthonormality(model_s, tree)
        extra = {"stiefel_max_YtY_minus_I": drift}
        if "geoopt" in modules:
            extra["geoopt_max_YtY_minus_I"] = _orthonormality(model_s, modules["geoopt"].param_tree())
        if "stiefel_graph" in modules:
            extra["stiefel_graph_max_YtY_minus_I"] = _orthonormality(model_s, modules["stiefel_graph"].param_tree())
    row = {"medians": medians, "notes": notes, "nonfinite_gradient_batches": bad, **extra}
    if syncs:
        row["host_syncs"] = syncs
    if profile is not None:
        row["profile"] = profile
    return row


def _profile_torch(fns, top: int) -> dict[str, str]:
    """torch.profiler tables (top ``top`` operators by self CPU time) of 5 steps of the Stiefel and Euclidean runs."""
    from torch.profiler import ProfilerActivity, profile

    tables = {}
    for name in ("stiefel", "euclidean"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                fns[name]()
        tables[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    return tables


def _orthonormality(model, params) -> float:
    """max over the Q/K/V projections of max|YᵀY − I| (host float; NaN if a weight is not finite)."""
    worst = 0.0
    for Y in model.stiefel_params(params):
        Yh = np.asarray(geoarray._backend.to_host(Y), dtype=np.float64)
        if not np.isfinite(Yh).all():
            return float("nan")
        E = np.swapaxes(Yh, -1, -2) @ Yh - np.eye(Yh.shape[-1])
        worst = max(worst, float(np.max(np.abs(E))))
    return worst


# -- numpy ---------------------------------------------------------------------------------------------


def bench_numpy(config: dict, batches_np, args) -> dict[str, Any]:
    import array_api_compat.numpy as xp

    return _bench_array_api(config, batches_np, args, xp, sync=None)


def bench_cupy(config: dict, batches_np, args) -> dict[str, Any]:
    """The NumPy backend's step on CuPy arrays (the same code on the GPU), each step synchronised."""
    try:
        import cupy
    except ImportError:
        raise SystemExit("training_step.py: --backends cupy needs CuPy (a CUDA machine with cupy installed)") from None
    try:
        n_devices = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise SystemExit(f"training_step.py: --backends cupy found no CUDA device ({exc})") from None
    if n_devices == 0:
        raise SystemExit("training_step.py: --backends cupy found no CUDA device")
    import array_api_compat.cupy as xp

    return _bench_array_api(config, batches_np, args, xp, sync=lambda: cupy.cuda.get_current_stream().synchronize())


def _bench_array_api(config: dict, batches_np, args, xp, sync) -> dict[str, Any]:
    """The analytic-pullback step of ``geoarray train vit`` on the namespace ``xp`` (NumPy, CuPy); ``sync``
    waits for the device at the end of each step (None on the host)."""
    from geoarray.train import value_and_grad

    dtype = getattr(xp, args.dtype)
    batches = [(xp.asarray(x, dtype=dtype), xp.asarray(y, dtype=dtype)) for x, y in batches_np]
    model_s, model_e = transformer(config, stiefel=True), transformer(config, stiefel=False)
    params = model_s.init(0, xp=xp, dtype=dtype)
    loss = nn.ClassificationL2Loss()

    def make_step(model, manifolds, with_update=True):
        next_batch = _cycle(batches)
        opt = optim.Adam(lr=LR, group_same_shape=True)  # as `geoarray train vit` builds it
        box = [optree.tree_map(lambda a: a.copy(), params), None]
        box[1] = opt.init(box[0], manifolds)

        def step():
            x, y = next_batch()
            value, grads = value_and_grad(model, loss, box[0], x, y, grad="analytic")
            if with_update:
                box[0], box[1] = opt.update(box[0], grads, box[1])
            if sync is not None:
                sync()
            return value

        return step, box

    fns, boxes = {}, {}
    fns["fwd_bwd"], _ = make_step(model_e, model_e.manifolds(), with_update=False)
    fns["euclidean"], _ = make_step(model_e, model_e.manifolds())
    fns["stiefel"], boxes["stiefel"] = make_step(model_s, model_s.manifolds())
    medians = interleaved_medians(fns, args.steps, warmup=args.warmup)
    notes = {
        "stiefel": "geoarray.optim.Adam with model.manifolds(), analytic pullbacks",
        "euclidean": "geoarray.optim.Adam without manifolds, analytic pullbacks",
    }
    return {
        "medians": medians,
        "notes": notes,
        "stiefel_max_YtY_minus_I": _orthonormality(model_s, boxes["stiefel"][0]),
    }


# -- jax -----------------------------------------------------------------------------------------------


def bench_jax(config: dict, batches_np, args) -> dict[str, Any]:
    if args.device == "cpu":  # keep JAX off any accelerator plugin; with --device cuda it must find the GPU
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import optax

    if args.device != "cpu" and jax.default_backend() != "gpu":
        raise SystemExit(
            f"training_step.py: --device {args.device}, but JAX runs on {jax.default_backend()} "
            f"(JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}); install JAX's CUDA plugin or unset JAX_PLATFORMS"
        )
    if args.device != "cpu":  # full float32 products, as torch's default (TF32 only with --tf32)
        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if args.tf32 else "highest")

    import geoarray.jax as gj

    dtype = getattr(jnp, args.dtype)
    batches = [(jnp.asarray(x, dtype=dtype), jnp.asarray(y, dtype=dtype)) for x, y in batches_np]
    model_s = transformer(config, stiefel=True)
    params = model_s.init(0, xp=jnp, dtype=dtype)
    loss = nn.ClassificationL2Loss()

    def loss_fn(p, batch):
        x, y = batch
        return loss.value(model_s.apply(p, x), y)

    def make_step(jitted, state):
        next_batch = _cycle(batches)
        box = [params, state]

        def step():
            box[0], box[1], value = jitted(box[0], box[1], next_batch())
            jax.block_until_ready((box[0], value))
            return value

        return step, box

    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    fwd_next = _cycle(batches)

    def fwd_bwd():
        return jax.block_until_ready(grad_fn(params, fwd_next()))

    fns, boxes, compile_s = {"fwd_bwd": fwd_bwd}, {}, {}
    builders = {
        "euclidean": lambda: gj.make_train_step(loss_fn, optax.adam(LR, b1=0.9, b2=0.99), params),
        "stiefel": lambda: gj.make_train_step(loss_fn, optim.Adam(lr=LR), params, model_s.manifolds()),
    }
    if args.peers:
        builders["geoarray_euclidean"] = lambda: gj.make_train_step(loss_fn, optim.Adam(lr=LR), params, None)
    start = time.perf_counter()
    fwd_bwd()
    compile_s["fwd_bwd"] = time.perf_counter() - start
    for name, build in builders.items():
        start = time.perf_counter()
        jitted, state = build()
        fns[name], boxes[name] = make_step(jitted, state)
        fns[name]()  # first call: trace + compile
        compile_s[name] = time.perf_counter() - start
    medians = interleaved_medians(fns, args.steps, warmup=args.warmup)
    notes = {
        "stiefel": "geoarray.jax.make_train_step + geoarray.optim.Adam with manifolds",
        "euclidean": "geoarray.jax.make_train_step + optax.adam",
    }
    bad = sum(
        not all(bool(jnp.isfinite(g).all()) for g in jax.tree_util.tree_leaves(grad_fn(params, b)[1])) for b in batches
    )
    return {
        "medians": medians,
        "notes": notes,
        "nonfinite_gradient_batches": bad,
        "compile_s": compile_s,
        "stiefel_max_YtY_minus_I": _orthonormality(model_s, boxes["stiefel"][0]),
        "device": str(jax.devices()[0]),
    }


# -- output --------------------------------------------------------------------------------------------


def ratios(medians: dict[str, float]) -> dict[str, float]:
    out = {"stiefel_over_euclidean": medians["stiefel"] / medians["euclidean"]}
    if "geoarray_euclidean" in medians:
        out["stiefel_over_geoarray_euclidean"] = medians["stiefel"] / medians["geoarray_euclidean"]
    if "stiefel_graph" in medians and "euclidean_graph" in medians:
        out["stiefel_graph_over_euclidean_graph"] = medians["stiefel_graph"] / medians["euclidean_graph"]
    if "geoopt" in medians:
        out["geoopt_over_euclidean"] = medians["geoopt"] / medians["euclidean"]
        out["geoopt_over_stiefel"] = medians["geoopt"] / medians["stiefel"]
    # the update's share = step − fwd+bwd; meaningless where the update is fused into the step (jax.jit) and
    # the difference drowns in the noise: None when the Euclidean update is under 5% of fwd+bwd
    euclid_update = medians["euclidean"] - medians["fwd_bwd"]
    out["stiefel_update_over_euclidean_update"] = (
        (medians["stiefel"] - medians["fwd_bwd"]) / euclid_update if euclid_update > 0.05 * medians["fwd_bwd"] else None
    )
    return out


def print_table(backend: str, row: dict[str, Any], steps: int) -> None:
    med, rat = row["medians"], row["ratios"]
    where = f" on {row['device']}" if "device" in row else ""
    print(f"\n{backend}: full ViT training step{where}, median of {steps} interleaved steps")
    keys = [k for k in COLUMNS if k in med]
    print("  ".join(f"{COLUMNS[k]:>12}" for k in keys) + f"  {'Stiefel/Euclid':>14}")
    print("  ".join(f"{med[k] * 1e3:>9.2f} ms" for k in keys) + f"  {rat['stiefel_over_euclidean']:>13.2f}×")
    upd = rat["stiefel_update_over_euclidean_update"]
    lines = [
        "update alone (step − fwd+bwd), Stiefel / Euclidean: "
        + (f"{upd:.1f}×" if upd is not None else "n/a (the update is within the noise of fwd+bwd)")
    ]
    if "stiefel_over_geoarray_euclidean" in rat:
        lines.append(f"Stiefel / geoarray's Euclidean Adam: {rat['stiefel_over_geoarray_euclidean']:.2f}×")
    if "geoopt_over_euclidean" in rat:
        lines.append(
            f"geoopt / Euclidean: {rat['geoopt_over_euclidean']:.2f}×, geoopt / geoarray Stiefel: "
            f"{rat['geoopt_over_stiefel']:.2f}×, geoopt max|YᵀY−I| {row['geoopt_max_YtY_minus_I']:.1e}"
        )
    if "stiefel_graph_over_euclidean_graph" in rat:
        lines.append(
            f"captured in CUDA graphs, Stiefel / Euclidean: {rat['stiefel_graph_over_euclidean_graph']:.2f}×, "
            f"Stiefel weights after the replays: max|YᵀY−I| {row['stiefel_graph_max_YtY_minus_I']:.1e}"
        )
    if "compile_s" in row:
        lines.append(
            "first call (trace + compile): " + ", ".join(f"{k} {v:.1f} s" for k, v in row["compile_s"].items())
        )
    lines.append(f"Stiefel weights after the run: max|YᵀY−I| {row['stiefel_max_YtY_minus_I']:.1e}")
    if row.get("nonfinite_gradient_batches"):
        lines.append(
            f"WARNING: {row['nonfinite_gradient_batches']} of {N_BATCHES} batches give non-finite autodiff gradients "
            "(saturated softmax: p = t exactly, and autodiff of ‖p − t‖ is 0·∞ there; the analytic pullback "
            "gives 0): those steps are skipped or turn weights into NaN, so this table does not time real steps"
        )
    for key, note in row["notes"].items():
        lines.append(f"{COLUMNS.get(key, key)}: {note}")
    for line in lines:
        print("  " + line)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=(*BACKENDS, "cupy"))
    parser.add_argument("--model", default="digits", choices=sorted(CONFIGS), help="ViT configuration (default digits)")
    parser.add_argument("--n-layers", type=int, default=None, help="transformer blocks (default: the model's)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per optimizer (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda: torch's device; JAX runs on the CPU for cpu, on its GPU otherwise"
    )
    parser.add_argument(
        "--torch-grad",
        default="autograd",
        choices=["autograd", "analytic"],
        help="torch gradients: autograd of apply (default) or the analytic pullbacks (Module(analytic=True))",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="K",
        help="torch: after the timing, profile 5 Stiefel and 5 Euclidean steps and print the top K operators",
    )
    parser.add_argument(
        "--capture",
        action="store_true",
        help="torch on CUDA: also time the whole step captured in a CUDA graph (capturable=True optimizers)",
    )
    parser.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        help="leave out the extra columns (geoarray's Euclidean Adam, geoopt): quicker smoke runs",
    )
    parser.add_argument(
        "--tf32", action="store_true", help="on a GPU, float32 products in TF32 (torch and JAX; default: full float32)"
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    config = dict(CONFIGS[args.model])
    if args.n_layers is not None:
        config["n_layers"] = args.n_layers
    batches = host_batches(args.model, config, args.batch_size)
    n_proj = 3 * config["n_heads"] * config["n_layers"]
    d_h = config["patch_dim"] // config["n_heads"]
    print(
        f"ViT '{args.model}': {config['n_layers']} blocks, {config['n_heads']} heads, {config['n_patches']} patches of "
        f"{config['patch_dim']}, {n_proj} projections on Stiefel({config['patch_dim']}, {d_h}); batch "
        f"{args.batch_size}, {args.dtype}, lr {LR:g}"
    )
    rows = []
    bench = {"torch": bench_torch, "numpy": bench_numpy, "jax": bench_jax, "cupy": bench_cupy}
    for backend in args.backends:
        row = bench[backend](config, batches, args)
        row["ratios"] = ratios(row["medians"])
        row["backend"] = backend
        print_table(backend, row, args.steps)
        for name, table in row.get("profile", {}).items():
            print(f"\n{backend} profile, 5 {name} steps (torch.profiler, self CPU time):\n{table}")
        row["medians_ms"] = {k: v * 1e3 for k, v in row.pop("medians").items()}
        rows.append(row)
    if args.json:
        out = {
            "benchmark": "training_step",
            "config": {**vars(args), **config},
            "machine": machine_info(args.threads),
            "rows": rows,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return rows


if __name__ == "__main__":
    main()

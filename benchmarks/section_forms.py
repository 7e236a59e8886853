"""The Householder section's three forms timed on one device, to choose among them from a measurement (#30).

An optimizer step on Stiefel(N, n) builds the section λ(Y) once, maps the gradient into its coordinates
(λᵀG, two row blocks) and applies λ to the retracted blocks. ``geoarray._backend.householder_section_form``
decides which form does this (its docstring gives the measurements behind each rule):

* ``compact-wy`` — :meth:`HouseholderSection.of` (Y): geqrf, the T factor, batched products;
* ``reconstructed`` — :meth:`HouseholderSection.of` (Y, reconstruct=True): the reflectors rebuilt from Y's
  orthonormality by an n×n LU instead of the N×n QR, then the same products;
* ``packed`` (torch only) — :class:`PackedHouseholderSection`: geqrf's packed reflectors, one ormqr per
  application;
* ``block-reflector`` — :class:`BlockReflectorSection`: Q = I − W M Wᵀ with W = Y − E·S, from matrix
  products and elementwise operations only (the GEMM-only route of #52: a signed n×n LU in elementwise
  steps, triangular inverses by products).

The rules were measured on the CPU; on the first GPU run (an H200) the packed form cost as if it handled the
336 frames of the ViT set one by one, and the process died in the GPT-2 set (432 × St(768, 64)) before
printing a row. This script times each form's *use* — build, ``coords_blocks(G)``, ``apply_blocks`` of the
two blocks — on the sets of ``benchmarks/gpu.py`` (``vit``, ``gpt2``, ``1024x64``, ``4096x128``; ``tiny``
for smoke runs), torch eager on ``--device``, JAX jitted on its default device and NumPy eager (a form that fails is
reported with its error, the others still timed). Each row gives the form's median per use, its ratio to
compact WY, ``picked`` where ``householder_section_form`` chooses it on that device, and the largest
difference of its result to compact WY's (the forms agree to rounding).

``--whole-step`` times a whole ``geoarray.optim.Adam(lr=1e-3)`` step instead (eager torch, jitted JAX), with
``householder_section_form`` forced to each form in turn. The forms' weights then differ by the steps'
rounding carried over the timed steps (about 1e-6 in float32), or by far more where the two float32
trajectories cross one of the section's frame flips (a reflector of geqrf changing sign) at different
steps: St(256, 32), packed against compact WY, 3.8e-6 after 40 steps and 5.5e-3 after 80 (in float64 they
agree to 1.6e-14 after 120).

Timing: ``gpu.timed_rounds`` — ``--inner`` uses between two device synchronisations, ``--rounds`` rounds,
the forms interleaved in alternating order, median per use; float32, TF32 off.

    python benchmarks/section_forms.py [--device cuda] [--sets vit gpt2 1024x64 4096x128 NxM…]
        [--backends torch jax numpy] [--rounds 20] [--inner 5] [--whole-step] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sets import stiefel_set
from _timing import machine_info, section_form
from gpu import timed_rounds

import geoarray
from geoarray import optim
from geoarray.manifolds.sections import BlockReflectorSection, HouseholderSection, PackedHouseholderSection

SETS = ("vit", "gpt2", "1024x64", "4096x128")
ALL_SETS = (*SETS, "tiny")
FORMS = {
    "compact-wy": HouseholderSection.of,
    "reconstructed": lambda Y: HouseholderSection.of(Y, reconstruct=True),
    "packed": PackedHouseholderSection.of,
    "block-reflector": BlockReflectorSection.of,
}


def use(section_of, Y, G):
    """What a step does with its section: build it, λᵀG in two blocks, λ applied to two blocks."""
    lam = section_of(Y)
    top, bottom = lam.coords_blocks(G)
    return lam.apply_blocks(-top, bottom)  # any pair of blocks; −top keeps the result from being G itself


def whole_step(form: str, params, manifolds, grads, wrap):
    """(step, holder): ``geoarray.optim.Adam(lr=1e-3)``'s update with the section forced to ``form``;
    ``holder[0]`` is the current weight set. The first step (a jit's trace) runs here."""
    opt = optim.Adam(lr=1e-3)
    update = wrap(opt.update)
    holder = [params, opt.init(params, manifolds)]

    def step():
        with section_form(form):
            holder[0], holder[1] = update(holder[0], grads, holder[1])

    step()
    return step, holder


def _set_name(text: str) -> str:
    if text in ALL_SETS or re.fullmatch(r"[1-9]\d*x[1-9]\d*", text):
        return text
    choices = ", ".join(ALL_SETS)
    raise argparse.ArgumentTypeError(f"{text!r} is not a weight set: choose {choices} or NxM (one Stiefel(N, M))")


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def bench(backend: str, name: str, args) -> list[dict]:
    if backend == "torch":
        import torch

        device = torch.device(args.device)
        xp = geoarray.as_namespace(torch)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        forms = dict(FORMS)
        wrap = lambda f: f  # noqa: E731  (eager)
    elif backend == "numpy":
        import numpy as np

        xp, device = geoarray.as_namespace(np), "cpu"
        forms = {k: v for k, v in FORMS.items() if k != "packed"}  # ormqr is a torch (LAPACK) call
        wrap = lambda f: f  # noqa: E731  (eager)
        sync = lambda: None  # noqa: E731
    else:
        import jax
        import jax.numpy as jnp

        xp, device = geoarray.as_namespace(jnp), jax.devices()[0]
        forms = {k: v for k, v in FORMS.items() if k != "packed"}  # ormqr is a torch (LAPACK) call
        wrap = jax.jit
        sync = None
    params, manifolds, grads = stiefel_set(name, xp, xp.float32, device if backend == "torch" else None)
    Y, G = params["W"], grads["W"]
    picked = geoarray._backend.householder_section_form(tuple(Y.shape), xp, device if backend == "torch" else None)
    outputs: dict = {}
    fns: dict = {}
    failed: dict = {}
    for form, section_of in forms.items():
        try:
            if args.whole_step:
                step, holder = whole_step(form, params, manifolds, grads, wrap)

                def run(step=step, holder=holder, form=form):
                    step()
                    outputs[form] = holder[0]["W"]

            else:
                f = wrap(lambda Y, G, s=section_of: use(s, Y, G))

                def run(f=f, form=form):
                    outputs[form] = f(Y, G)

            run()  # the first call: a jit's compilation, an unsupported form's error
            fns[form] = run
        except Exception as exc:  # a form that cannot run here: report it, time the rest
            failed[form] = _error(exc)
    if sync is None:
        import jax

        sync = lambda: jax.block_until_ready(outputs)  # noqa: E731
    medians = timed_rounds(fns, sync, args.rounds, args.inner)
    base = medians.get("compact-wy")
    reference = outputs.get("compact-wy")
    rows = []
    for form in forms:
        row = {"backend": backend, "set": name, "device": str(device), "form": form, "picked": form == picked}
        value = failed.get(form, medians.get(form))
        if isinstance(value, float):
            row["ms"] = 1e3 * value
            if isinstance(base, float):
                row["over_compact_wy"] = value / base
            if reference is not None:
                row["max_abs_difference_to_compact_wy"] = float(xp.max(xp.abs(outputs[form] - reference)))
        else:
            row["error"] = value
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device (cuda, or cpu)")
    parser.add_argument("--backends", nargs="+", default=["torch", "jax"], choices=["torch", "jax", "numpy"])
    parser.add_argument("--sets", nargs="+", default=list(SETS), type=_set_name, help=f"{', '.join(ALL_SETS)} or NxM")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inner", type=int, default=5, help="uses between two synchronisations")
    parser.add_argument(
        "--whole-step", action="store_true", help="time a whole Adam step with each form forced, not the section's use"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.inner < 1:
        parser.error(f"--rounds and --inner must be at least 1, got {args.rounds} and {args.inner}")
    rows: list[dict] = []
    print(f"{'backend':7} {'set':9} {'device':>8} {'form':13} {'ms':>9} {'÷ compact WY':>12} {'|Δ|':>8}")
    for backend in args.backends:
        if backend == "torch":
            import torch

            if args.device.startswith("cuda") and not torch.cuda.is_available():
                raise SystemExit("section_forms.py: torch sees no CUDA GPU; use --device cpu")
            torch.backends.cuda.matmul.allow_tf32 = False
        elif backend == "jax":
            import jax

            jax.config.update("jax_default_matmul_precision", "highest")
        for name in args.sets:
            for row in bench(backend, name, args):
                rows.append(row)  # printed and saved at once: a run cut short keeps what it measured
                timing = (
                    f"{row['ms']:9.3f} {row.get('over_compact_wy', float('nan')):11.2f}× "
                    f"{row.get('max_abs_difference_to_compact_wy', float('nan')):8.1e}"
                    if "ms" in row
                    else row["error"]
                )
                mark = "  picked" if row["picked"] else ""
                print(f"{backend:7} {name:9} {row['device']:>8} {row['form']:13} {timing}{mark}", flush=True)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump({"benchmark": "section_forms", "machine": machine_info(), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()

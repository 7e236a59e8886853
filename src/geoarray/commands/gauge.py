"""``geoarray gauge {table,check,fix}``: the gauge group of transformer stacks from the command line.

    geoarray gauge table                          van Nierop's Table 1 next to the exact counts
    geoarray gauge check --config gpt2-tiny       random gauge element on a config (random weights)
    geoarray gauge check --checkpoint model.safetensors
    geoarray gauge fix --checkpoint IN --out OUT  write the gauge-fixed (smaller) model

Building the parser imports nothing heavy; numpy, safetensors, torch or jax are imported by the run
functions. Errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ._common import BACKENDS, CommandError, namespace_for, require

__all__ = ["add_parser", "run_check", "run_fix", "run_table", "table_rows"]

# van Nierop, "Transformer models are gauge invariant", Table 1 (parameter count as printed)
PAPER_TABLE = {
    "gpt2": ("117M", 1473409, "1.3 %"),
    "gpt2-xl": ("1.56B", 11_100_000, "0.7 %"),
    "llama-65b": ("65.2B", 201_000_000, "0.3 %"),
}
_TABLE_NAMES = {"gpt2": "gpt2", "gpt2-xl": "gpt2-XL", "llama-65b": "LLaMA-65B", "all-minilm-l6-v2": "all-MiniLM-L6-v2"}
_PRINTED = {"gpt2": "1473409", "gpt2-xl": "11.1M", "llama-65b": "201M"}

# tiny configurations for `check --config NAME` (random weights, Jacobian referee included)
TINY = {
    "gpt2-tiny": dict(arch="gpt2", n_layers=2, n_heads=2, d_head=2, d_model=5, d_ff=4, vocab=8, n_ctx=4),
    "gpt2-relu-tiny": dict(
        arch="gpt2", n_layers=2, n_heads=2, d_head=2, d_model=5, d_ff=4, vocab=8, n_ctx=4, activation="relu"
    ),
    "llama-tiny": dict(arch="llama", n_layers=2, n_heads=2, d_head=2, d_model=5, d_ff=4, vocab=8, n_ctx=4),
    "bert-tiny": dict(arch="bert", n_layers=2, n_heads=2, d_head=2, d_model=5, d_ff=4, vocab=8, n_ctx=4, norm_eps=1e-2),
}
# random float64 weights beyond this would need several GB: use a checkpoint or a smaller config
MAX_RANDOM_PARAMS = 200_000_000


def _fail(prog: str, message: str) -> int:
    from ._common import one_line

    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    return 2


def _reason(exc: Exception) -> str:
    """The first line of an error's message, without the exception's class (the messages name the
    argument and the fix; a KeyError's is only the key)."""
    if isinstance(exc, KeyError):
        return f"missing key {exc.args[0]!r}" if exc.args else "missing key"
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    # the library asks its caller for config=; on the command line the configuration comes from the file
    return text.replace("; pass config= (layout", "; put the model's Hugging Face config.json beside it (layout")


def _check_out_file(out: str, what: str) -> None:
    """``--out FILE`` checked before any work: not a directory, in a directory that exists."""
    if os.path.isdir(out):
        raise CommandError(f"--out {out!r} is a directory; give the path of the {what} to write")
    out_dir = os.path.dirname(os.path.abspath(out))
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CommandError(f"--out {out!r}: {out_dir!r} is a file, not a directory")
    if not os.path.isdir(out_dir):
        raise CommandError(f"--out directory {out_dir!r} does not exist")


def _config_from_arg(text: str) -> Any:
    """A preset/tiny name, a JSON object, or a path to a JSON file (geoarray or Hugging Face keys)."""
    from ..models.language import PRESETS, as_config, config_from_hf

    if text in TINY:
        return as_config(TINY[text])
    if text in PRESETS:
        return as_config(text)
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--config is not valid JSON ({exc.msg})") from None
    elif os.path.isfile(text):
        with open(text, encoding="utf-8") as fh:
            try:
                obj = json.load(fh)
            except json.JSONDecodeError as exc:
                raise CommandError(f"--config file {text!r} is not valid JSON ({exc.msg})") from None
    else:
        names = ", ".join([*TINY, *PRESETS])
        raise CommandError(f"--config must be a name ({names}), a JSON object or a JSON file; got {text!r}")
    if isinstance(obj, dict) and "model_type" in obj:
        return config_from_hf(obj)
    return as_config(obj)


def table_rows() -> list[dict[str, Any]]:
    """The rows of ``geoarray gauge table``: paper's Table 1 next to eq. 17 and the exact counts."""
    from ..gauge.counting import redundancy

    rows = []
    for key in ("gpt2", "gpt2-xl", "llama-65b", "all-minilm-l6-v2"):
        r = redundancy(key)
        unfixed = 0  # the canonical form of geoarray.gauge.fixing removes every source for these configs
        paper = PAPER_TABLE.get(key)
        rows.append(
            {
                "model": _TABLE_NAMES[key],
                "config": key,
                "n_params": r.n_params,
                "paper_n_params": paper[0] if paper else None,
                "paper_redundancy": _PRINTED.get(key),
                "paper_percent": paper[2] if paper else None,
                "eq17": r.paper,
                "exact": r.total,
                "exact_percent": 100 * r.fraction,
                "gauge_fixed_saving": r.total - unfixed,
                "breakdown": r.breakdown,
            }
        )
    return rows


def _fmt(n: int) -> str:
    return f"{n:,}"


def run_table(args: argparse.Namespace) -> int:
    rows = table_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = ("model", "params", "paper: params", "paper: redundancy", "paper %", "eq. 17", "exact", "exact %")
    body = [
        (
            r["model"],
            _fmt(r["n_params"]),
            r["paper_n_params"] or "—",
            r["paper_redundancy"] or "—",
            r["paper_percent"] or "—",
            _fmt(r["eq17"]),
            _fmt(r["exact"]),
            f"{r['exact_percent']:.3f} %",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]

    def line(cells: tuple) -> str:
        return "  ".join(
            str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(head))
    print("  ".join("-" * w for w in widths))
    for b in body:
        print(line(b))
    print()
    print("exact = Jacobian nullity at generic weights (geoarray.gauge.counting), by source:")
    for r in rows:
        parts = ", ".join(f"{k} {_fmt(v)}" for k, v in r["breakdown"].items())
        print(f"  {r['model']}: {parts}")
    print(
        "eq. 17 = 2·n_t·n_h·d_h² + (d_e−1)(d_e−2)/2. Tied embeddings (gpt2) break the residual rotation; "
        "RoPE (LLaMA) leaves d_h, not d_h², per query/key head;\nRMSNorm gives SO(d_e); norms, biases, "
        "centring, embedding shifts and SwiGLU/ReLU units add the rest. all-MiniLM-L6-v2 is post-LN (no rotation)."
    )
    return 0


def _print_report(report: dict[str, Any]) -> None:
    keys = (
        "source",
        "arch",
        "backend",
        "dtype",
        "group",
        "untied",
        "n_params",
        "max_abs_output_diff",
        "max_rel_output_diff",
        "relative_weight_change",
        "paper_redundancy",
        "redundancy",
        "redundancy_numerical",
    )
    for k in keys:
        v = report.get(k)
        if isinstance(v, float):
            v = f"{v:.3e}"
        elif isinstance(v, int) and not isinstance(v, bool):
            v = _fmt(v)
        print(f"{k:>24}: {v}")
    print(
        f"{'redundancy_breakdown':>24}: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in report["redundancy_breakdown"].items())
    )


def run_check(args: argparse.Namespace) -> int:
    prog = "geoarray gauge check"
    try:
        xp = namespace_for(args.backend)
        if args.out:
            _check_out_file(args.out, "JSON report")
        from ..gauge.check import check
        from ..models.language import count_params

        if args.checkpoint is not None:
            if not os.path.exists(args.checkpoint):
                raise CommandError(f"checkpoint {args.checkpoint!r} does not exist")
            require("safetensors", extra="gauge")
            target: Any = args.checkpoint
        else:
            target = _config_from_arg(args.config)
            n = count_params(target)
            if n > MAX_RANDOM_PARAMS:
                raise CommandError(
                    f"{n:,} parameters are too many for random float64 weights (limit {MAX_RANDOM_PARAMS:,}); "
                    "use `geoarray gauge table` for the counts or a smaller config"
                )
        numerical = None if args.numerical == "auto" else args.numerical == "yes"
        report = check(target, args.seed, xp=xp, numerical=numerical)
    except CommandError as exc:
        return _fail(prog, str(exc))
    except (ValueError, TypeError, OSError, KeyError) as exc:
        return _fail(prog, _reason(exc))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_report(report)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as fh:
                json.dump(report, fh, indent=2, default=str)
        except OSError as exc:  # a file-system error after the checks above: exit code 1, as geoarray.cli's
            _fail(prog, f"--out {args.out!r} could not be written ({exc.strerror or exc})")
            return 1
    return 0


def run_fix(args: argparse.Namespace) -> int:
    prog = "geoarray gauge fix"
    try:
        xp = namespace_for(args.backend)
        from .. import random as _random
        from ..gauge.checkpoints import save_fixed
        from ..gauge.fixing import gauge_fix
        from ..models.language import load_checkpoint

        if not os.path.exists(args.checkpoint):
            raise CommandError(f"checkpoint {args.checkpoint!r} does not exist")
        require("safetensors", extra="gauge")
        _check_out_file(args.out, "gauge-fixed safetensors file")
        model, params = load_checkpoint(args.checkpoint, xp=xp)
        fixed, reduced = gauge_fix(model, params)
        c = model.config
        rng = _random.generator(args.seed)
        T = min(c.n_ctx, 16)
        tokens = xp.asarray(rng.integers(0, c.vocab, size=(2, T)), dtype=xp.int64)
        types = xp.asarray(rng.integers(0, c.n_types, size=(2, T)), dtype=xp.int64) if c.arch == "bert" else None
        out = model.apply(params, tokens, types)
        out_fixed = fixed.apply(reduced, tokens, types)
        diff = float(xp.max(xp.abs(out_fixed - out)))
        scale = float(xp.max(xp.abs(out)))
        save_fixed(args.out, fixed, reduced, dtype=args.dtype)
    except CommandError as exc:
        return _fail(prog, str(exc))
    except (ValueError, TypeError, OSError, KeyError) as exc:
        return _fail(prog, _reason(exc))
    summary = {
        "checkpoint": args.checkpoint,
        "out": args.out,
        "arch": c.arch,
        "n_params": model.n_params(),
        "n_params_fixed": fixed.n_params(),
        "saving": fixed.saving,
        "saving_breakdown": fixed.saving_breakdown,
        "unfixed": fixed.unfixed,
        "max_abs_output_diff": diff,
        "max_rel_output_diff": diff / scale if scale > 0 else diff,
        "stored_dtype": args.dtype,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for k, v in summary.items():
            if isinstance(v, dict):
                v = ", ".join(f"{a} {_fmt(b)}" for a, b in v.items())
            elif isinstance(v, float):
                v = f"{v:.3e}"
            elif isinstance(v, int):
                v = _fmt(v)
            print(f"{k:>20}: {v}")
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``gauge {table,check,fix}`` on the ``geoarray`` sub-parsers."""
    gauge = subparsers.add_parser(
        "gauge",
        help="gauge symmetry of transformer stacks: redundancy table, invariance check, gauge fixing",
        description=(
            "The gauge group of transformer stacks (van Nierop, 'Transformer models are gauge invariant'): "
            "count, verify and remove the redundant parameters."
        ),
    )
    sub = gauge.add_subparsers(title="subcommands", metavar="SUBCOMMAND", parser_class=type(gauge))

    def missing(args: argparse.Namespace) -> int:
        return _fail("geoarray gauge", f"choose one of {', '.join(sub.choices)} (see geoarray gauge --help)")

    gauge.set_defaults(func=missing)

    table = sub.add_parser(
        "table", help="the paper's Table 1 next to the exact counts", description="Redundancy counts."
    )
    table.add_argument("--json", action="store_true", help="print the rows as JSON")
    table.set_defaults(func=run_table)

    check = sub.add_parser(
        "check",
        help="apply a random gauge element and report output/weight changes and redundancy",
        description=(
            "Apply a random gauge transformation to a model (random weights for --config, loaded weights for "
            "--checkpoint) and report the output difference, the weight change and the redundancy counts."
        ),
    )
    src = check.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--config",
        metavar="SPEC",
        help=f"a name ({', '.join([*TINY, 'gpt2', 'all-minilm-l6-v2'])}), a JSON object or a JSON file",
    )
    src.add_argument("--checkpoint", metavar="PATH", help="a safetensors file (GPT-2, BERT or LLaMA names)")
    check.add_argument("--seed", type=int, default=0, help="seed of the weights, inputs and group element")
    check.add_argument("--backend", choices=BACKENDS, default="numpy", help="array backend (float64 on CPU)")
    check.add_argument(
        "--numerical",
        choices=("auto", "yes", "no"),
        default="auto",
        help="compute the Jacobian-nullity referee (auto: models with ≤ 3000 parameters)",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--out", metavar="FILE", help="also write the report as JSON to FILE")
    check.set_defaults(func=run_check)

    fix = sub.add_parser(
        "fix",
        help="write the gauge-fixed (smaller) model of a checkpoint",
        description="Gauge-fix a checkpoint: store only its non-redundant parameters, verified on random inputs.",
    )
    fix.add_argument("--checkpoint", metavar="IN", required=True, help="input safetensors file")
    fix.add_argument("--out", metavar="OUT", required=True, help="output safetensors file (gauge-fixed format)")
    fix.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="dtype of the stored entries")
    fix.add_argument("--seed", type=int, default=0, help="seed of the verification inputs")
    fix.add_argument("--backend", choices=BACKENDS, default="numpy", help="array backend (float64 on CPU)")
    fix.add_argument("--json", action="store_true", help="print the summary as JSON")
    fix.set_defaults(func=run_fix)
    return gauge

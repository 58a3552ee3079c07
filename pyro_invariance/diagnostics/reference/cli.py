"""The command line of the reference posteriors: list, regenerate, check and score.

Regenerate (the four fixed-η entries: 21 minutes on one thread of the project's shared 2-core machine
under a load of 4–6 — basis-regression 2.8, rotation-toy-2d-full 5.2, rotation-toy-2d-none 4.0,
invariant-mlp-digits 9.1 minutes; the two latent-η entries on the same machine under a load of 3–8
from other jobs — basis-regression-lambda 13.2 minutes, invariant-mlp-digits-eta 52 minutes (4 chains
of 12–15 minutes); ``--quick`` is a smoke test that must be written elsewhere with ``--out``)::

    python -m pyro_invariance.diagnostics.reference regenerate [--name NAME ...] [--quick --out DIR]
    python -m pyro_invariance.diagnostics.reference check      # recompute R-hat / ESS from the stored draws
    python -m pyro_invariance.diagnostics.reference score [--name NAME] [--guide GUIDE ...] [--steps N]
    python -m pyro_invariance.diagnostics.reference list
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.diagnostics.reference.entries import ENTRIES, QUICK, entry, names
from pyro_invariance.diagnostics.reference.nuts import diagnose, passes, run_nuts
from pyro_invariance.diagnostics.reference.scoring import fit_and_score
from pyro_invariance.diagnostics.reference.store import (
    REFERENCE_DIR,
    Reference,
    load_reference,
    reference_paths,
    save_reference,
)
from pyro_invariance.registry import UnknownNameError

__all__ = ["build_parser", "main"]


def _score_row(r: Mapping[str, Any]) -> str:
    return (
        f"{r['reference']:24s} {r['guide']:14s} "
        f"mean err max {r['mean_error_max']:.3f} (mean {r['mean_error_mean']:.3f})  "
        f"var ratio {math.exp(r['log_var_ratio_min']):.3f}–{math.exp(r['log_var_ratio_max']):.3f} "
        f"(geomean {r['var_ratio_geomean']:.3f})  sliced W2 {r['sliced_w2']:.3f} (floor {r['sliced_w2_floor']:.3f})  "
        f"W1 {r['w1_mean']:.3f}  ELBO/N {r['elbo_per_datum']:.3f}  {r['fit_seconds']:.0f}s"
    )


def _file_size(path: Path) -> str:
    return f"{path.stat().st_size / 1024:.0f} KiB" if path.is_file() else "-"


def _row(ref: Reference, npz: Path | None = None) -> str:
    d = ref.metadata["diagnostics"]
    scalars = sum(int(np.prod(v.shape[2:], dtype=int)) for v in ref.draws.values())
    size = f"  {_file_size(npz)}" if npz is not None else ""
    return (
        f"{ref.name:24s} {scalars:4d} scalars  {ref.num_chains}×{ref.num_draws} draws  R-hat max {d['rhat_max']:.4f}  "
        f"ESS bulk min {d['ess_bulk_min']:6.0f}  tail min {d['ess_tail_min']:6.0f}  "
        f"divergences {ref.metadata.get('divergences', 0)}  {ref.metadata.get('wall_seconds', float('nan')):.0f}s{size}"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m pyro_invariance.diagnostics.reference``."""
    parser = argparse.ArgumentParser(
        prog="python -m pyro_invariance.diagnostics.reference",
        description="NUTS reference posteriors of small catalogue entries.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the catalogue of references and what is stored")
    regen = sub.add_parser("regenerate", help="run NUTS and store the draws and metadata")
    regen.add_argument("--name", action="append", help="reference name (repeatable; default: all)")
    regen.add_argument("--out", default=None, help=f"output folder (default {REFERENCE_DIR})")
    regen.add_argument(
        "--quick", action="store_true", help=f"smoke test with {QUICK}: does not reach the thresholds; needs --out"
    )
    regen.add_argument("--seed", type=int, default=None, help="override the entries' seed")
    regen.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    regen.add_argument("--progress", action="store_true", help="show NUTS progress bars")
    score = sub.add_parser("score", help="fit guides to an entry by SVI and score them against its reference")
    score.add_argument("--name", action="append", help="reference name (repeatable; default: all)")
    score.add_argument("--guide", action="append", help="guide name (repeatable; default full-rank and mean-field)")
    score.add_argument("--steps", type=int, default=1500, help="SVI steps (default 1500)")
    score.add_argument("--lr", type=float, default=0.05, help="learning rate of all guide parameters (default 0.05)")
    score.add_argument("--init-scale", type=float, default=0.3, help="initial guide scale (default 0.3)")
    score.add_argument("--samples", type=int, default=2000, help="guide draws per score (default 2000)")
    score.add_argument("--seed", type=int, default=0)
    score.add_argument("--dir", default=None, help=f"folder of the references (default {REFERENCE_DIR})")
    score.add_argument("--json", default=None, help="also write the scores to this JSON file")
    score.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    check = sub.add_parser("check", help="recompute R-hat and ESS from the stored draws")
    check.add_argument("--dir", default=None, help=f"folder of the references (default {REFERENCE_DIR})")
    check.add_argument("--name", action="append", help="reference name (repeatable; default: all)")
    return parser


def _list() -> int:
    for e in ENTRIES.values():
        npz, _ = reference_paths(e.name)
        print(
            f"{e.name:24s} {e.model} on {e.data}; {e.symmetry}\n{'':24s} {e.description}\n"
            f"{'':24s} {e.paper}; stored: {_file_size(npz)}"
        )
    return 0


def _score(args: argparse.Namespace, selected: list[str]) -> int:
    torch.set_num_threads(args.threads)
    rows = fit_and_score(
        selected,
        args.guide or ["full-rank", "mean-field"],
        steps=args.steps,
        lr=args.lr,
        init_scale=args.init_scale,
        num_samples=args.samples,
        seed=args.seed,
        directory=args.dir,
        log=lambda r: print(_score_row(r), flush=True),
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _check(args: argparse.Namespace, selected: list[str]) -> int:
    ok = True
    for n in selected:
        ref = load_reference(n, args.dir)
        diag = diagnose(ref.draws)
        ref.metadata["diagnostics"].update({k: diag[k] for k in ("rhat_max", "ess_bulk_min", "ess_tail_min")})
        good = passes(diag)
        ok &= good
        print(_row(ref, reference_paths(n, args.dir)[0]) + ("" if good else "  FAILS"))
    return 0 if ok else 1


def _regenerate(args: argparse.Namespace, selected: list[str]) -> int:
    torch.set_num_threads(args.threads)
    overrides: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.seed is not None:
        overrides["seed"] = args.seed
    ok = True
    total = time.perf_counter()
    for n in selected:
        print(f"{n}: NUTS ...", flush=True)
        ref = run_nuts(n, progress=args.progress, log=lambda s: print(s, flush=True), **overrides)
        ref.metadata["quick"] = bool(args.quick)
        if args.quick:
            ref.metadata["command"] += " --quick"
        npz, meta = save_reference(ref, args.out)
        good = passes(ref.metadata["diagnostics"])
        ok &= good or args.quick
        print(_row(ref, npz) + ("" if good else "  below thresholds") + f"\n  wrote {npz} and {meta}", flush=True)
    print(f"total {time.perf_counter() - total:.0f}s")
    return 0 if ok else 1


@pyro_scope()
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyro_invariance.diagnostics.reference {list, regenerate, check, score}``; see ``--help``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list()
    selected = args.name or names()
    for n in selected:
        try:
            entry(n)  # unknown names fail before any work
        except UnknownNameError as exc:
            parser.error(str(exc))
    if args.command == "score":
        return _score(args, selected)
    if args.command == "check":
        return _check(args, selected)
    if args.quick and args.out is None:
        parser.error("--quick references do not meet the thresholds: write them elsewhere with --out DIR")
    return _regenerate(args, selected)

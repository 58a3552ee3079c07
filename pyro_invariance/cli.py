"""Command line: ``pyro-invariance list | fit | evaluate | compare | demo``.

Examples::

    pyro-invariance list
    pyro-invariance fit --model invariant-mlp --guide block-cholesky --data rotated-digits \
        --steps 1000 --seed 0 --out results/run1 --model-arg symmetry=rotation
    pyro-invariance evaluate --run results/run1
    pyro-invariance compare --model invariant-mlp --data rotated-digits \
        --guides mean-field,matrix-normal,block-cholesky --K 10,100,1000 --steps 300 --out results/cmp
    pyro-invariance demo

``fit`` writes ``result.json`` (settings, history, metrics), ``checkpoint.pt`` and plots to
``--out`` and prints a summary table; ``--resume`` continues an interrupted run from its
checkpoint (bit-for-bit with the same settings). An ``--out`` that already holds a run is never
replaced unless ``--overwrite`` is given.

Errors in the user's input are reported in one line on stderr with exit code 2 (argparse's
convention), before any compute where they can be known then; Ctrl-C / SIGTERM during ``fit``
stop after the current step with ``interrupted at step k; checkpoint at PATH`` and exit code
128 + the signal number (130 / 143).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

import pyro_invariance.guides as _guides  # noqa: F401  (registers the guides)
import pyro_invariance.models as _models  # noqa: F401  (registers the models)
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.catalogue import build, load_run
from pyro_invariance.data.images import load_dataset
from pyro_invariance.diagnostics.compare import compare_guides, format_eta, image_size_of, text_table
from pyro_invariance.diagnostics.evaluation import evaluate, task_for
from pyro_invariance.diagnostics.plots import model_figures, plot_eta_history, save_figure
from pyro_invariance.infer.checkpoint import atomic_write_text, peek_step
from pyro_invariance.infer.config import config_overrides, config_parent
from pyro_invariance.infer.distributed import (
    Ranks,
    current_ranks,
    launch_rank,
    record_failure,
    setup_ranks,
    under_torchrun,
)
from pyro_invariance.infer.fast_step import torch_threads
from pyro_invariance.infer.interrupts import FitInterrupted
from pyro_invariance.infer.laplace import fit_laplace
from pyro_invariance.infer.runlock import RunLock
from pyro_invariance.infer.training import LR_SETTINGS, fit, make_deterministic
from pyro_invariance.registry import DATASETS, GUIDES, MODELS, UnknownNameError
from pyro_invariance.tasks import get as get_task
from pyro_invariance.validation import check_positive_int, check_seed

#: a bare word (``rotation``, ``tx+rot``, ``layerwise-fc``) is a string; anything else must be JSON
_BARE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_+\-.:/]*")


def _parse_kv(items: Sequence[str] | None, option: str = "--model-arg") -> dict[str, Any]:
    """``["a=1", "b=rotation", "c=[1,8,8]"]`` → ``{"a": 1, "b": "rotation", "c": [1, 8, 8]}``.

    A value is JSON (numbers, ``true``/``false``/``null``, lists, objects, quoted strings), or a
    bare word (letters, digits, ``_+-.:/``, not starting with a digit), which is taken as a string.
    Anything else (``hidden=[16,``, ``lr=1e-``) is refused, naming ``option``.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"{option}: expected KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if not key.isidentifier():
            raise ValueError(f"{option}: {key!r} is not a valid keyword name (in {item!r})")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError as exc:
            if not _BARE_WORD.fullmatch(raw) or raw.lower() in ("nan", "inf", "infinity", "true", "false", "none"):
                raise ValueError(f"{option}: {item!r} is not valid JSON ({exc.msg}) nor a bare word") from None
            out[key] = raw
    return out


def cmd_list(args: argparse.Namespace) -> int:
    sections = {"models": MODELS, "guides": GUIDES, "datasets": DATASETS}
    for title, registry in sections.items():
        if args.what not in (None, title):
            continue
        print(f"{title}:")
        for entry in registry.items():
            print(f"  {entry.name:36s} {entry.summary}")
    return 0


def _data_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    data_kwargs = _parse_kv(args.data_arg, "--data-arg")
    if args.data_dir is not None:
        data_kwargs["data_dir"] = args.data_dir
    if args.download:
        data_kwargs["download"] = True
    for name in ("train_size", "test_size"):
        value = getattr(args, name)
        if value is not None:  # 0 is refused by the dataset, not dropped
            data_kwargs[name] = check_positive_int(f"--{name.replace('_', '-')}", value)
    return data_kwargs


def check_out_folder(out: Path) -> Path:
    """``out`` is a folder (created if missing) that this process can write to."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {str(out)!r} is not writable: {exc.strerror or exc}") from None
    return out


def prepare_out(
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    products: Sequence[str] = ("checkpoint.pt", "result.json"),
    can_resume: bool = True,
) -> Path:
    """Check an output folder before any compute: a writable folder (:func:`check_out_folder`) not
    holding a run (any of ``products``) unless ``resume`` (which needs its checkpoint) or ``overwrite``.
    ``can_resume``: the command has ``--resume`` (the refusal suggests only options the command has)."""
    return _check_out_contents(check_out_folder(out), resume, overwrite, products, can_resume)


def _check_out_contents(
    out: Path, resume: bool, overwrite: bool, products: Sequence[str], can_resume: bool = True
) -> Path:
    """The part of :func:`prepare_out` after the folder check (what ``out`` already holds)."""
    existing = [name for name in products if (out / name).exists()]
    if resume:
        if not (out / "checkpoint.pt").is_file():
            raise ValueError(f"--resume: no checkpoint at {str(out / 'checkpoint.pt')!r}")
    elif existing and not overwrite:
        step = peek_step(out / "checkpoint.pt") if "checkpoint.pt" in existing else None
        held = f" (checkpoint at step {step})" if step is not None else ""
        options = "use --resume to continue it, --overwrite" if can_resume else "use --overwrite"
        raise ValueError(
            f"--out {str(out)!r} already holds {', '.join(existing)}{held}: {options} to replace it, or another --out"
        )
    elif existing:
        print(f"pyro-invariance: --overwrite: replacing {', '.join(existing)} in {str(out)!r}", file=sys.stderr)
    return out


def _build_spec(args: argparse.Namespace) -> dict[str, Any]:
    data_kwargs = _data_kwargs(args)
    model_kwargs = _parse_kv(args.model_arg, "--model-arg")
    objective = args.objective
    guide = args.guide or ("map" if objective == "laplace" else "block-cholesky")
    if objective == "laplace":
        # MAP weights; the precisions are buffers the evidence updates set (pyro_invariance.infer.laplace)
        if guide != "map":
            raise ValueError(
                f"--objective laplace trains MAP weights: use --guide map (or leave it out), not {guide!r}"
            )
        if model_kwargs.setdefault("prior", "fixed") != "fixed":
            raise ValueError(
                "--objective laplace sets the precisions itself: leave out --model-arg prior=... or use 'fixed'"
            )
    spec = {
        "model": args.model,
        "model_kwargs": model_kwargs,
        "guide": guide,
        "guide_kwargs": _parse_kv(args.guide_arg, "--guide-arg"),
        "data": args.data,
        "data_kwargs": data_kwargs,
    }
    if objective != "elbo":
        spec["objective"] = objective
    return spec


def _save_plots(result: Any, out: Path, data: Any = None) -> list[str]:
    """Write ``eta.png`` and the model's own figures
    (:func:`~pyro_invariance.diagnostics.plots.model_figures`, e.g. an InvariantMLP's ``filters.png``
    and ``orbits.png``) as ``<name>.png``; returns the paths."""
    history = {result.spec["model"] if result.spec else "run": result.history}
    files = [save_figure(plot_eta_history(history, image_size=image_size_of(data)), out / "eta.png")]
    files += [save_figure(fig, out / f"{name}.png") for name, fig in model_figures(result.model, data).items()]
    return [str(f) for f in files]


def run_fit(
    spec: dict[str, Any],
    out: Path,
    fit_kwargs: dict[str, Any],
    num_eval_samples: int = 16,
    eval_seed: int | None = None,
) -> dict[str, Any]:
    """Build the spec, fit, evaluate, write result.json + plots to ``out``; returns the summary.

    ``fit_kwargs``: FitConfig overrides and ``fit``'s run options; ``eval_seed`` (default: the
    run's seed) seeds the held-out evaluation.

    ``out`` is checked first (:func:`prepare_out`) and locked for the whole run
    (:class:`~pyro_invariance.infer.runlock.RunLock`), so a second writer is refused before any compute.
    With ``strategy="ddp"`` (run under ``torchrun``) every rank trains and rank 0 alone checks, locks
    and writes ``out``.
    """
    ranks, _ = setup_ranks(fit_kwargs.get("strategy", "single"), str(fit_kwargs.get("device", "cpu")))
    with contextlib.ExitStack() as stack:

        def claim() -> Path:  # the folder must exist for its lock; then what it holds
            folder = check_out_folder(Path(out))
            stack.enter_context(RunLock(folder / "checkpoint.pt"))
            _check_out_contents(
                folder,
                bool(fit_kwargs.get("resume")),
                bool(fit_kwargs.get("overwrite")),
                ("checkpoint.pt", "result.json"),
            )
            return folder

        folder = ranks.together(claim if ranks.is_main else lambda: Path(out))
        return _run_fit_locked(spec, folder, fit_kwargs, num_eval_samples, eval_seed, ranks)


def _run_fit_locked(
    spec: dict[str, Any],
    out: Path,
    fit_kwargs: dict[str, Any],
    num_eval_samples: int,
    eval_seed: int | None,
    ranks: Ranks,
) -> dict[str, Any]:
    data, model, guide = build(spec)
    fit_kwargs = dict(fit_kwargs)  # FitConfig overrides + run options; fit resolves model/guide defaults
    laplace_kw = {
        k: fit_kwargs.pop(k)
        for k in ("laplace_every", "laplace_warmup", "laplace_curvature", "laplace_delta_update")
        if k in fit_kwargs
    }
    extra: dict[str, Any] = {}
    if spec.get("objective") == "laplace":
        result = fit_laplace(
            model,
            guide,
            data,
            checkpoint_path=out / "checkpoint.pt",
            spec=spec,
            every=laplace_kw.get("laplace_every", 50),
            warmup=laplace_kw.get("laplace_warmup", 100),
            curvature=laplace_kw.get("laplace_curvature", "kfac"),
            delta_update=laplace_kw.get("laplace_delta_update", "gradient"),
            **fit_kwargs,
        )
        extra = {
            "laplace_log_evidence_per_datum": result.log_evidence / result.num_data,
            "laplace_evidence_log": result.evidence_log,
        }
    else:
        result = fit(model, guide, data, checkpoint_path=out / "checkpoint.pt", spec=spec, **fit_kwargs)
    seed = result.config.seed if eval_seed is None else eval_seed
    metrics = _metrics(result.model, result.guide, data, num_eval_samples, result.config.device, seed)
    summary = {
        "model": spec["model"],
        "guide": spec["guide"],
        "data": spec["data"],
        "task": task_for(result.model, data).name,
        "eta": result.eta,
        "eta_readable": format_eta(result.model, image_size_of(data), result.guide),
        "metrics": metrics,
        "eval_seed": seed,
        "final_elbo_per_datum_train_minibatch": result.final_elbo,
        "seconds": result.seconds,
        **extra,
    }
    payload = result.to_dict()
    payload["summary"] = summary
    summary["plots"] = []
    if ranks.is_main:  # rank 0 writes (every rank holds the same model and guide)
        atomic_write_text(out / "result.json", json.dumps(payload, indent=1))  # first: a failing plot loses no numbers
        summary["plots"] = _save_plots(result, out, data)
        atomic_write_text(out / "result.json", json.dumps(payload, indent=1))  # again, listing the plots
    return summary


def _metrics(
    model: Any, guide: Any, data: Any, num_samples: int, device: Any = None, seed: int = 0
) -> dict[str, float]:
    """Held-out metrics as the model's task defines them
    (:func:`~pyro_invariance.diagnostics.evaluation.evaluate`), seeded by ``seed``: ``fit`` passes the
    run's seed, as ``compare_guides`` does, so both report the same numbers."""
    return evaluate((model, guide), data, num_samples=num_samples, device=device, seed=seed)


def _fit_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``fit``'s arguments from the ``fit`` command: the FitConfig settings the user gave
    (:func:`~pyro_invariance.infer.config.config_overrides`) and the run options."""
    kw: dict[str, Any] = {
        **config_overrides(args),
        "progress": not args.no_progress,
        "resume": args.resume,
        "checkpoint_every": args.checkpoint_every,
        "overwrite": args.overwrite,
    }
    if args.allow_change:
        changes = [c.strip().replace("-", "_") for c in args.allow_change.split(",") if c.strip()]
        if not args.resume or any(c not in LR_SETTINGS for c in changes):
            raise ValueError(
                f"--allow-change takes learning rates ({','.join(LR_SETTINGS)}) with --resume, got "
                f"{args.allow_change!r}" + ("" if args.resume else " without --resume")
            )
        kw["allow_changes"] = changes
    if args.objective == "laplace":
        kw["laplace_every"] = check_positive_int("--laplace-every", args.laplace_every)
        kw["laplace_warmup"] = check_positive_int("--laplace-warmup", args.laplace_warmup, minimum=0)
        kw["laplace_curvature"] = args.laplace_curvature
        kw["laplace_delta_update"] = args.laplace_delta_update
    return kw


def _print_summaries(summaries: list[dict[str, Any]]) -> None:
    """One table row per run summary; the metric columns are those of the first summary's task
    (:attr:`pyro_invariance.tasks.Task.columns`, the ones its metrics hold)."""
    columns = get_task(summaries[0]["task"]).table_columns(summaries[0]["metrics"])
    rows = [("model", "guide", "data", "η", *(c.title for c in columns), "time")]
    for s in summaries:
        m = s["metrics"]
        rows.append(
            (
                s.get("label", s["model"]),
                s["guide"],
                s["data"],
                s["eta_readable"],
                *(c.render(m.get(c.key)) for c in columns),
                f"{s['seconds']:.0f}s",
            )
        )
    print(text_table(rows))


def cmd_fit(args: argparse.Namespace) -> int:
    if args.deterministic:
        make_deterministic()
    spec = _build_spec(args)
    summary = run_fit(spec, Path(args.out), _fit_kwargs(args), check_positive_int("--eval-samples", args.eval_samples))
    if not current_ranks().is_main:
        return 0
    _print_summaries([summary])
    print(f"\nwrote {Path(args.out) / 'result.json'}, {Path(args.out) / 'checkpoint.pt'} and plots {summary['plots']}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    check_seed(args.seed, "--seed")  # before the run is loaded
    run = Path(args.run)
    checkpoint = run / "checkpoint.pt" if run.is_dir() else run
    data = None
    if args.data:
        data = load_dataset(args.data, data_dir=args.data_dir)
    model, guide, data, state = load_run(checkpoint, data)
    metrics = _metrics(model, guide, data, check_positive_int("--eval-samples", args.eval_samples), seed=args.seed)
    spec = state["spec"]
    summary = {
        "model": spec["model"],
        "guide": spec["guide"],
        "data": args.data or spec["data"],
        "task": task_for(model, data).name,
        "eta_readable": format_eta(model, image_size_of(data), guide),
        "metrics": metrics,
        "eval_seed": args.seed,
        "seconds": state.get("seconds", 0.0),
    }
    _print_summaries([summary])
    if run.is_dir():
        atomic_write_text(run / "evaluation.json", json.dumps(summary, indent=1))
    return 0


def _int_list(text: str, what: str) -> list[int]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    out = []
    for t in items:
        try:
            out.append(int(t))
        except ValueError:
            raise ValueError(f"{what} must be a comma-separated list of integers, got {text!r}") from None
    if not out:
        raise ValueError(f"{what} is empty")
    return out


def _guide_kwargs(items: Sequence[str] | None, guides: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--guide-arg KEY=VALUE`` (every guide) or ``--guide-arg GUIDE:KEY=VALUE`` (that guide)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        head = item.split("=", 1)[0]
        if ":" in head:
            name, rest = item.split(":", 1)
            if name not in guides:
                raise ValueError(
                    f"--guide-arg {item!r} names guide {name!r}, which is not in --guides {','.join(guides)}"
                )
            out.setdefault(name, {}).update(_parse_kv([rest], "--guide-arg"))
        else:
            for name in guides:
                out.setdefault(name, {}).update(_parse_kv([item], "--guide-arg"))
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    """Fit several guides with the same seeds and budget; print the bound/metric table."""
    guides = [g.strip() for g in args.guides.split(",") if g.strip()]
    if not guides:
        raise ValueError("--guides is empty")
    for name in guides:  # unknown names: the registry's error (with suggestions) before anything runs
        GUIDES.entry(name)
    Ks = _int_list(args.K, "--K")
    if args.out:  # checked before any compute, so the table cannot be lost at the end
        prepare_out(
            Path(args.out),
            overwrite=args.overwrite,
            products=("table.md", "table.json", "bounds.png"),
            can_resume=False,
        )
    log = None if args.no_progress else (lambda msg: print(msg, file=sys.stderr, flush=True))
    cmp = compare_guides(
        args.model,
        args.data,
        guides,
        K=Ks,
        bound_samples=args.bound_samples,
        eval_subset=args.eval_subset,
        eval_samples=args.eval_samples,
        bound_vectorize=args.vectorize_bounds,
        guide_kwargs=_guide_kwargs(args.guide_arg, guides),
        model_kwargs=_parse_kv(args.model_arg, "--model-arg"),
        data_kwargs=_data_kwargs(args),
        progress=not args.no_progress,
        log=log,
        **config_overrides(args),
    )
    if args.format == "json":
        print(cmp.to_json())
    elif args.format == "markdown":
        print(cmp.to_markdown())
    else:
        print(cmp.to_text())
    if args.out:
        files = cmp.save(args.out)
        print(f"\nwrote {', '.join(str(p) for p in files.values())}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: learned rotation invariance vs no invariance on rotated digits."""
    out = Path(args.out)
    common = {"guide": "block-cholesky", "guide_kwargs": {}, "data": "rotated-digits", "data_kwargs": {}}
    runs = {
        "learned rotation": {"model": "invariant-mlp", "model_kwargs": {"symmetry": "rotation"}, **common},
        "no invariance": {"model": "invariant-mlp", "model_kwargs": {"symmetry": "none"}, **common},
    }
    fit_kwargs = {"steps": args.steps, "seed": args.seed, "progress": not args.no_progress, "overwrite": args.overwrite}
    print(f"pyro-invariance demo: InvariantMLP (RFF, H=256, S=16) on rotated digits, {args.steps} SVI steps each")
    if not args.overwrite:  # both runs' folders are checked before the first one trains
        for label in runs:
            prepare_out(out / label.replace(" ", "-"), can_resume=False)  # demo has no --resume
    summaries, histories = [], {}
    t0 = time.perf_counter()
    for label, spec in runs.items():
        print(f"fitting '{label}' ...", flush=True)
        summary = run_fit(spec, out / label.replace(" ", "-"), fit_kwargs)
        summary["label"] = label
        summaries.append(summary)
        histories[label] = json.loads((out / label.replace(" ", "-") / "result.json").read_text())["history"]
    fig = plot_eta_history(histories, title="rotated digits: learned vs no invariance")
    plot = save_figure(fig, out / "eta_and_elbo.png")
    print()
    _print_summaries(summaries)
    learned = summaries[0]
    print(
        f"\nlearned η_rot = {learned['eta'].get('rot', float('nan')):.3f} rad "
        f"(full rotation invariance is π = 3.142); total {time.perf_counter() - t0:.0f}s"
    )
    print(f"plots: {plot}, {learned['plots'][-1]}")
    return 0


def _catalogue_parent() -> argparse.ArgumentParser:
    """Options naming a model × dataset (shared by ``fit`` and ``compare``)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model and data")
    g.add_argument("--model", required=True, help="a registered model (pyro-invariance list models)")
    g.add_argument("--data", required=True, help="a registered dataset (pyro-invariance list datasets)")
    g.add_argument("--model-arg", action="append", metavar="KEY=VALUE", help="model keyword (JSON value or bare word)")
    g.add_argument("--data-arg", action="append", metavar="KEY=VALUE", help="dataset keyword (JSON value or bare word)")
    g.add_argument("--data-dir", default=None, help="where dataset files live (fashion-mnist IDX, torchvision)")
    g.add_argument("--download", action="store_true", help="allow torchvision to download MNIST/CIFAR-10")
    g.add_argument("--train-size", type=int, default=None, help="keep the first N training examples")
    g.add_argument("--test-size", type=int, default=None, help="keep the first N test examples")
    g.add_argument("--eval-samples", type=int, default=16, help="posterior draws in the held-out metrics")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser; the training settings are generated from :class:`~pyro_invariance.infer.config.FitConfig`."""
    catalogue, config = _catalogue_parent(), config_parent()
    parser = argparse.ArgumentParser(prog="pyro-invariance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--traceback", action="store_true", help="show the Python traceback of an error (debugging)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list models, guides and datasets")
    p.add_argument("what", nargs="?", choices=["models", "guides", "datasets"])
    p.set_defaults(func=cmd_list)

    _add_fit(sub, catalogue, config)
    _add_evaluate(sub)
    _add_compare(sub, catalogue, config)
    _add_demo(sub)
    return parser


def _add_fit(
    sub: argparse._SubParsersAction, catalogue: argparse.ArgumentParser, config: argparse.ArgumentParser
) -> None:
    """``fit``: a model × guide × dataset, by the ELBO or the Laplace evidence, with checkpoints."""
    p = sub.add_parser("fit", help="fit a model × guide × dataset", parents=[catalogue, config])
    p.add_argument("--guide", default=None, help="default: block-cholesky (map with --objective laplace)")
    p.add_argument("--guide-arg", action="append", metavar="KEY=VALUE", help="guide keyword (JSON value or bare word)")
    p.add_argument(
        "--objective",
        default="elbo",
        choices=["elbo", "laplace"],
        help="laplace: MAP weights, prior precisions by the Laplace evidence (layer-wise models)",
    )
    p.add_argument("--laplace-every", type=int, default=50, help="steps between Laplace evidence updates")
    p.add_argument("--laplace-warmup", type=int, default=100, help="MAP steps before the first update")
    p.add_argument(
        "--laplace-curvature",
        default="kfac",
        choices=["kfac", "diagonal"],
        help="Laplace curvature: KFAC (paper 004 Eq. 9; default) or a diagonal GGN",
    )
    p.add_argument(
        "--laplace-delta-update",
        default="gradient",
        choices=["gradient", "mackay"],
        help="how δ follows the evidence: MacKay's fixed point or Adam steps on log δ",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic CUDA kernels, so GPU runs repeat and resume bit-for-bit (slower)",
    )
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (same settings)")
    p.add_argument("--overwrite", action="store_true", help="replace a run that OUT already holds")
    p.add_argument(
        "--allow-change",
        default=None,
        metavar="lr,eta_lr,...",
        help="with --resume: learning rates that may differ from the saved run (rescue a diverged run)",
    )
    p.add_argument("--out", default="results/run")
    p.set_defaults(func=cmd_fit)


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    """``evaluate``: a saved run's metrics, on its own or another dataset."""
    p = sub.add_parser("evaluate", help="evaluate a saved run (folder or checkpoint file)")
    p.add_argument("--run", required=True)
    p.add_argument("--data", default=None, help="evaluate on another dataset (same shapes)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--eval-samples", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="seed of the evaluation's guide and symmetry draws")
    p.set_defaults(func=cmd_evaluate)


def _add_compare(
    sub: argparse._SubParsersAction, catalogue: argparse.ArgumentParser, config: argparse.ArgumentParser
) -> None:
    """``compare``: several guides fitted alike, and their bounds side by side."""
    p = sub.add_parser(
        "compare",
        help="fit several guides alike; table of ELBO, IWAE_K, PSIS k̂, η, metrics, cost",
        parents=[catalogue, config],
    )
    p.add_argument(
        "--guides",
        default="mean-field,matrix-normal,block-cholesky",
        help="comma-separated guide names (pyro-invariance list guides)",
    )
    p.add_argument("--K", default="10,100,1000", help="importance sample sizes of the IWAE bounds, e.g. 10,100,1000")
    p.add_argument(
        "--bound-samples",
        type=int,
        default=None,
        help="guide draws for the bounds (default max(2 × max K, 46): every IWAE_K gets a standard error)",
    )
    p.add_argument(
        "--eval-subset",
        type=int,
        default=None,
        help="bound the evidence of the first N training points only (default: all)",
    )
    p.add_argument(
        "--vectorize-bounds",
        action="store_true",
        help="draw the bound's particles in vectorised batches (models that broadcast over latents)",
    )
    p.add_argument("--format", default="text", choices=["text", "markdown", "json"])
    p.add_argument("--out", default=None, help="write table.md, table.json and bounds.png here")
    p.add_argument("--overwrite", action="store_true", help="replace a table that OUT already holds")
    p.add_argument(
        "--guide-arg",
        action="append",
        metavar="[GUIDE:]KEY=VALUE",
        help="guide keyword (JSON value) for every guide, or for GUIDE only",
    )
    p.set_defaults(func=cmd_compare)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    """``demo``: the main job on embedded data."""
    p = sub.add_parser(
        "demo",
        help="the main job on embedded data (rotated digits)",
        parents=[config_parent(only=("steps", "seed", "threads"))],
    )
    p.set_defaults(steps=1000, seed=0, threads=1)  # the demo's own defaults: 1 thread is fastest here
    p.add_argument("--out", default="results/demo")
    p.add_argument("--overwrite", action="store_true", help="replace the runs an earlier demo left in OUT")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_demo)


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _resume_hint(args: argparse.Namespace) -> str:
    """How to continue an interrupted ``fit``: a run of several shards needs them again, also in one process."""
    shards = getattr(args, "shards", 1)
    if shards == 1:
        return "; continue with --resume"
    if getattr(args, "strategy", "single") == "ddp":
        return (
            f"; continue with the same command and --resume, or in one process with --resume --shards {shards} "
            "(without --strategy ddp)"
        )
    return f"; continue with --resume --shards {shards}"


def _end(message: str, every_rank: bool = False) -> None:
    """Print ``pyro-invariance: <message>`` once per run and record it for torchrun's failure summary.

    In a data-parallel run rank 0 prints it: the ranks stop together, and an error that stops them
    together names the rank it came from. The other ranks print an error (``every_rank``) only
    outside torchrun, where no failure summary would show it."""
    line = f"pyro-invariance: {message}"
    recorded = record_failure(line)
    rank = launch_rank()
    if rank == 0 or (every_rank and not recorded):
        print(line if rank == 0 else f"{line} (rank {rank})", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 user error, 128 + signal when interrupted).

    Under ``torchrun`` it runs inside torch's ``record``, so an error it does not catch reaches
    torchrun's failure summary with its traceback (the errors it catches are recorded with their one line)."""
    if under_torchrun():
        return record(_main)(argv)
    return _main(argv)


@pyro_scope()
def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with torch_threads(getattr(args, "threads", None)):  # fit, compare, demo: the one FitConfig option
            return int(args.func(args) or 0)
    except FitInterrupted as exc:
        _end(f"{exc}{_resume_hint(args) if exc.checkpoint is not None else ''}")
        return 128 + int(exc.signum)
    except KeyboardInterrupt:
        _end("interrupted")
        return 130
    except (UnknownNameError, ValueError, TypeError, OSError, FloatingPointError, RuntimeError) as exc:
        # user errors (bad names, values, files; CheckpointError, RunLockedError, device errors)
        if args.traceback:
            raise
        _end(f"error: {_one_line(exc)}", every_rank=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())

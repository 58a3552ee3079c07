"""Shared helpers of the investigation's scripts: threads, machine info, result files, resumable units.

The benchmarks' helpers for threads, command line, headers and unit files, plus what these scripts need of
their own: their results folder, machine record, argument parsing and resumable units. Every script calls
:func:`set_threads` first (default 1 thread: the project's machines have 2 cores shared with other jobs),
records :func:`machine_info` and the exact command that regenerates it at the top of its markdown file, and
writes ``research/uncertain_symmetry/results/<name>.md`` with a JSON twin.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyro
import torch

# The helpers that do not depend on where results go are the benchmarks' own (re-exported for the scripts).
from benchmarks._common import (
    _git,
    _json_default,
    cpu_model,
    set_threads,
    write_unit,
)
from benchmarks._common import command_line as command_line
from benchmarks._common import header_markdown as header_markdown
from benchmarks._common import parse_part as parse_part

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parents[2]


def machine_info() -> dict[str, Any]:
    """CPU, core count, load, library versions, torch threads and the git commit."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "load_average_1_5_15min": [round(v, 2) for v in load],
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "git_commit": commit + ("+uncommitted changes" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table; ``align`` entries are "l" or "r" (default: first left, rest right)."""
    header = [str(h) for h in header]
    align = align or ["l"] + ["r"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(stem: str, markdown: str, payload: dict[str, Any], out_dir: Path | None = None) -> tuple[Path, Path]:
    """Write ``<out_dir>/<stem>.md`` and ``<out_dir>/<stem>.json``; returns both paths."""
    out = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out / f"{stem}.md", out / f"{stem}.json"
    md_path.write_text(markdown.rstrip() + "\n")
    json_path.write_text(json.dumps(payload, indent=1, default=_json_default) + "\n")
    return md_path, json_path


def log(msg: str) -> None:
    """Print with a timestamp and flush (the scripts run under nohup with a log file)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def unit_script_parser(doc: str, stem: str) -> tuple[argparse.ArgumentParser, Any]:
    """The command line that every benchmark writing unit files shares: its description (``doc``'s first paragraph),
    a required group of mutually exclusive modes (returned empty, for the script's ``--run``, ``--render``, …), and
    ``--work-dir`` (default ``research/uncertain_symmetry/results/<stem>_units``), ``--out-dir`` and ``--threads``."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    parser.add_argument("--work-dir", type=Path, default=Path(f"research/uncertain_symmetry/results/{stem}_units"))
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--threads", type=int, default=1)
    return parser, group


def parse_script_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments from ``argv``, with torch's thread count set from ``--threads``."""
    args = parser.parse_args(argv)
    set_threads(args.threads)
    return args


def parse_seeds(parser: Any, value: str, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """``--seeds a,b,…`` (in run order) as a tuple, each among ``allowed``; anything else ends with ``parser.error``."""
    try:
        seeds = tuple(int(s) for s in value.split(","))
        if not set(seeds) <= set(allowed):
            raise ValueError
    except ValueError:
        parser.error(f"--seeds must be comma-separated seeds from {allowed}, got {value!r}")
    return seeds


def fill_unit(
    path: Path,
    header: dict[str, Any],
    keys: Iterable[Hashable],
    key_of: Callable[[dict[str, Any]], Hashable],
    evaluate: Callable[[Any], dict[str, Any]],
    describe: Callable[[Any, dict[str, Any]], str] | None = None,
) -> dict[str, Any]:
    """The unit at ``path`` (``{**header, "points": [...]}``, new if absent) with a point for every one of ``keys``.

    The keys whose point is missing (``key_of(point)`` names a stored point's key) are evaluated in order,
    ``evaluate(key)``, and the file is replaced after each (:func:`write_unit`), so a stopped run resumes where it
    stopped; ``describe(key, point)`` is logged for each new point."""
    unit = json.loads(path.read_text()) if path.exists() else {**header, "points": []}
    done = {key_of(p) for p in unit["points"]}
    for key in keys:
        if key in done:
            continue
        point = evaluate(key)
        unit["points"].append(point)
        write_unit(path, unit)
        if describe is not None:
            log(describe(key, point))
    return unit


def save_figure(fig: Any, path: Path) -> None:
    """Lay out ``fig`` (a :class:`matplotlib.figure.Figure`, not held by pyplot) and save it to ``path`` (100 dpi)."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def publish(stem: str, markdown: str, payload: dict[str, Any], out_dir: Path | str | None = None) -> tuple[Path, Path]:
    """:func:`write_results`, then print the table and log where it went (the end of every script)."""
    md_path, json_path = write_results(stem, markdown, payload, Path(out_dir) if out_dir else None)
    print(markdown)
    log(f"wrote {md_path} and {json_path}")
    return md_path, json_path

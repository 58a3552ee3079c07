"""Shared helpers of the benchmark scripts: threads, machine info, matmul rate, result files.

Every benchmark script calls :func:`set_threads` first (default 1 thread: the project's machines
have 2 cores shared with other jobs, and torch with 2 threads can run small ops far slower under
load, docs/methods.md §5), records :func:`machine_info` and the exact command that regenerates it at the
top of its markdown file, and writes ``benchmarks/results/<name>.md`` with a JSON twin.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: The words of every result file's "Verdict" section and of the results index (benchmarks/README.md).
VERDICTS = ("reproduced", "partly reproduced", "not reproduced", "not run")
REPO_ROOT = Path(__file__).resolve().parent.parent


def set_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)`` (and the inter-op pool where it is still settable)."""
    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(int(threads))
    except RuntimeError:  # already set, or parallel work already started
        pass


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (or ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> dict[str, Any]:
    """CPU, core count, load, library versions, torch threads and the git commit."""
    import pyro

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


def command_line() -> str:
    """The command that reproduces this run, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_str = str(script.relative_to(REPO_ROOT))
    except ValueError:
        script_str = str(script)
    return shlex.join([".venv/bin/python", script_str, *sys.argv[1:]])


def matmul_gflops(n: int = 2048, reps: int = 7) -> float:
    """Measured float32 ``n×n @ n×n`` rate in GFLOP/s at the current thread count (median of ``reps``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def md_table(header: str | Sequence[str], rows: Iterable[Sequence[Any]], align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table; ``header`` a list or one string of cells joined by " | "; ``align`` entries are "l"
    or "r" (default: first left, rest right)."""
    header = header.split(" | ") if isinstance(header, str) else [str(h) for h in header]
    align = align or ["l"] + ["r"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def header_markdown(title: str, info: dict[str, Any], settings: dict[str, Any], command: str, intro: str = "") -> str:
    """Title, intro, the regenerate command, the machine and the exact settings."""
    parts = [f"# {title}", ""]
    if intro:
        parts += [intro.strip(), ""]
    parts += ["Regenerate with (from the repository root):", "", "```", command, "```", ""]
    parts += ["Machine:", ""]
    parts += [f"- {k}: `{v}`" for k, v in info.items()]
    parts += ["", "Settings:", ""]
    parts += [f"- {k}: `{v}`" for k, v in settings.items()]
    parts.append("")
    return "\n".join(parts)


def write_results(stem: str, markdown: str, payload: dict[str, Any], out_dir: Path | None = None) -> tuple[Path, Path]:
    """Write ``<out_dir>/<stem>.md`` and ``<out_dir>/<stem>.json``; returns both paths."""
    out = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out / f"{stem}.md", out / f"{stem}.json"
    md_path.write_text(markdown.rstrip() + "\n")
    json_path.write_text(json.dumps(payload, indent=1, default=_json_default) + "\n")
    return md_path, json_path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def log(msg: str) -> None:
    """Print with a timestamp and flush (benchmarks run under nohup with a log file)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_part(parser: Any, value: str) -> tuple[int, int]:
    """``--part k/n`` (this process runs items k, k + n, …) as ``(k, n)``; anything else ends with ``parser.error``."""
    try:
        k, n = (int(v) for v in value.split("/"))
        if not 0 <= k < n:
            raise ValueError
    except ValueError:
        parser.error(f"--part must be k/n with 0 ≤ k < n, got {value!r}")
    return k, n


def write_unit(path: Path, unit: dict[str, Any]) -> None:
    """Replace ``path`` whole with ``unit`` as JSON (a run stopped mid-write leaves the last complete file)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(unit) + "\n")
    partial.replace(path)


def fill_unit(
    path: Path,
    header: dict[str, Any],
    keys: Iterable[Hashable],
    key_of: Callable[[dict[str, Any]], Hashable],
    evaluate: Callable[[Any], dict[str, Any]],
    describe: Callable[[Any, dict[str, Any]], str] | None = None,
) -> dict[str, Any]:
    """The unit at ``path`` (``{**header, "points": [...]}``, new if absent) with a point for every one of ``keys``.

    The benchmarks' one resumable runner. The keys whose point is missing (``key_of(point)`` names a stored
    point's key) are evaluated in order, ``evaluate(key)``, and the file is replaced after each
    (:func:`write_unit`), so a stopped run resumes where it stopped; ``describe(key, point)`` is logged for each
    new point. Each evaluation must seed itself, so that ``--part k/n`` processes (each filling its own unit with
    ``keys[k::n]``) give the serial run's numbers; :func:`unit_points` gathers the parts."""
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


def unit_points(
    paths: Iterable[Path], keys: Sequence[Hashable], key_of: Callable[[dict[str, Any]], Hashable], partial: bool = False
) -> list[dict[str, Any]]:
    """The points of ``keys``, in that order, gathered from the unit files ``paths`` (e.g. the files of the
    ``--part`` processes). Raises ``ValueError`` naming the missing keys unless ``partial`` (then they are left out)."""
    found: dict[Hashable, dict[str, Any]] = {}
    for path in paths:
        for point in json.loads(Path(path).read_text())["points"]:
            found.setdefault(key_of(point), point)
    missing = [k for k in keys if k not in found]
    if missing and not partial:
        raise ValueError(f"{len(missing)} of {len(keys)} units have no result yet (first: {missing[0]!r})")
    return [found[k] for k in keys if k in found]


def verdict_section(verdict: str, seeds: str, lines: Sequence[str] = ()) -> str:
    """The "Verdict" section every result file ends with: ``verdict`` is one of :data:`VERDICTS`, ``seeds``
    says on how many seeds (e.g. "3 of 3 seeds", "seed 0 only"), ``lines`` the criteria it was read from."""
    if verdict == "no claim":  # a measurement of this library (cost, defaults), not a paper's claim
        return "\n".join(["## Verdict", "", f"**No paper claim** ({seeds}).", "", *lines, ""])
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    return "\n".join(["## Verdict", "", f"**{verdict[0].upper() + verdict[1:]}** ({seeds}).", "", *lines, ""])


def verdict_of(checks: Sequence[bool]) -> str:
    """ "reproduced" when every check holds, "partly reproduced" when some do, else "not reproduced"."""
    return "reproduced" if all(checks) else "partly reproduced" if any(checks) else "not reproduced"


def publish(stem: str, markdown: str, payload: dict[str, Any], out_dir: Path | str | None = None) -> tuple[Path, Path]:
    """:func:`write_results`, then print the table and log where it went (the end of every benchmark)."""
    md_path, json_path = write_results(stem, markdown, payload, Path(out_dir) if out_dir else None)
    print(markdown)
    log(f"wrote {md_path} and {json_path}")
    return md_path, json_path

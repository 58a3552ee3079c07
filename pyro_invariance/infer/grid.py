"""Grids of fits as array jobs: one process per cell, one result file per cell, resume what is missing.

A *grid* is a fixed, ordered list of cells — JSON-serialisable dicts of settings, e.g. one per
(guide, seed) — and a module-level function ``run_cell(cell) -> dict`` that fits one cell and returns
a JSON-serialisable result. A cell's result is written atomically, together with its settings, to
``<out_dir>/cells/<digest>.json``, named by a digest of the settings (not by the cell's position), so
the cells can run anywhere, in any order, as separate processes:

* on a cluster, as a plain **job array** — one array task per cell, no scheduler of our own;
* on one machine, ``--jobs N``: the unfinished cells in ``N`` worker processes of the standard
  library's :class:`concurrent.futures.ProcessPoolExecutor` (``spawn``, a fresh process per cell).

Nothing is silently overwritten (``--overwrite`` reruns a finished cell) and a failed cell loses no
finished one. Because a result is found by its settings, a grid can grow (more seeds, methods or
variants) or be reordered and keep every finished cell, two grids can share a directory, and a result
is never read for settings other than its own (:meth:`Grid.collect` also checks the settings stored in
the file). The index of a cell is its position in the list: what ``--cell`` and an array task
address. The numbers equal the serial loop's as long as ``run_cell`` seeds everything it draws from
and sets its own thread count (a cell must not depend on the cells that ran before it in the same
process).

A script that builds a :class:`Grid` adds the flags with :func:`add_grid_arguments` and dispatches them
with :func:`run_grid_command` (``benchmarks/full_rank_defaults.py`` is the worked example)::

    python script.py                            # serial, in this process (the script's own loop)
    python script.py --jobs 2                   # unfinished cells, 2 processes at a time, then collect
    python script.py --cell 3                   # one cell in this process (--overwrite to redo it)
    python script.py --missing                  # prints the unfinished cells as an array spec: 0-3,7,9
    python script.py --collect                  # assembles the table; lists the missing cells if any

    # SLURM (the task id is the cell index); once an array has ended, the same line runs what is left:
    sbatch --array=$(python script.py --missing) --wrap "python script.py --cell \\$SLURM_ARRAY_TASK_ID"
    python script.py --collect                  # once the array has finished

``--cell`` with no value reads the index from the scheduler's environment
(:func:`cell_index_from_env`: SLURM, PBS/Torque, PBS Pro as given; LSF and SGE array indices start at
1, so submit ``--missing 1``'s spec there and the index is shifted back). Give every task of one grid
the same ``--grid-dir`` on a shared file system.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyro_invariance.infer.checkpoint import atomic_write_text

FORMAT = "pyro_invariance.grid/2"  # /2: result files named by the digest of their settings

#: Array-index variables of the common schedulers and the index of their first task.
ENV_INDEX_VARIABLES: tuple[tuple[str, int], ...] = (
    ("SLURM_ARRAY_TASK_ID", 0),  # SLURM: the index as given to --array
    ("PBS_ARRAY_INDEX", 0),  # PBS Pro: as given to -J
    ("PBS_ARRAYID", 0),  # Torque: as given to -t
    ("LSB_JOBINDEX", 1),  # LSF: job[1-N], indices start at 1 (0 = not an array job)
    ("SGE_TASK_ID", 1),  # SGE / UGE: -t 1-N, indices start at 1 ("undefined" = not an array job)
)


def _canonical(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists); refuses what JSON cannot hold."""
    try:
        return json.loads(json.dumps(value, allow_nan=True))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"not JSON-serialisable: {exc}") from None


def _digest(canonical: Any) -> str:
    """The file name of a cell's result: 16 hex digits of the SHA-256 of its settings in canonical JSON."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def array_spec(indices: Sequence[int], base: int = 0) -> str:
    """Indices as a job-array spec, runs joined by ``-``: ``[0, 1, 2, 3, 7, 9]`` → ``"0-3,7,9"``.

    ``base`` is added to every index (``base=1`` for LSF and SGE, whose array indices start at 1).
    """
    values = sorted({int(i) + base for i in indices})
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return ",".join(parts)


def cell_index_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """The 0-based cell index of this array task, from the scheduler's environment; ``None`` outside one.

    Reads, in this order, ``SLURM_ARRAY_TASK_ID``, ``PBS_ARRAY_INDEX``, ``PBS_ARRAYID`` (taken as
    given) and ``LSB_JOBINDEX``, ``SGE_TASK_ID`` (1-based: 1 is cell 0). Raises a one-line
    ``ValueError`` for a value that is not a valid index.
    """
    env = os.environ if environ is None else environ
    for name, base in ENV_INDEX_VARIABLES:
        raw = env.get(name)
        if raw is None or raw.strip() == "" or (name == "SGE_TASK_ID" and raw.strip() == "undefined"):
            continue
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an array index (an integer)") from None
        if name == "LSB_JOBINDEX" and value == 0:  # LSF sets 0 in a job that is not an array
            continue
        if value < base:
            raise ValueError(f"{name}={raw!r}: {name.split('_')[0]} array indices start at {base}")
        return value - base
    return None


@dataclass
class Grid:
    """A fixed list of cells, the function that runs one, and the directory of their results.

    Args:
        cells: JSON-serialisable dicts of settings, in a fixed order (the index is the position).
        run_cell: ``run_cell(cell) -> dict``, a module-level function (pickled by name for worker
            processes) returning a JSON-serialisable result; it must seed itself and set its threads.
        out_dir: results go to ``<out_dir>/cells/<digest of the cell's settings>.json``.
        command: the command that runs this grid's script, named in messages (e.g. "python x.py").
    """

    cells: list[dict[str, Any]]
    run_cell: Callable[[dict[str, Any]], dict[str, Any]]
    out_dir: Path
    command: str = "python <script>"
    _canonical_cells: list[Any] = field(init=False, repr=False)
    _names: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        self.cells = [dict(c) for c in self.cells]
        if not self.cells:
            raise ValueError("a grid needs at least one cell")
        try:
            self._canonical_cells = [_canonical(c) for c in self.cells]
        except TypeError as exc:
            raise TypeError(f"grid cells must be JSON-serialisable dicts: {exc}") from None
        self._names = [_digest(c) for c in self._canonical_cells]
        seen: dict[str, int] = {}
        for i, name in enumerate(self._names):
            if name in seen:  # one result file would serve both
                raise ValueError(f"grid cells {seen[name]} and {i} have the same settings; cells must differ")
            seen[name] = i

    def __len__(self) -> int:
        return len(self.cells)

    def path(self, index: int) -> Path:
        """The result file of cell ``index`` (named by the digest of its settings)."""
        return self.out_dir / "cells" / f"{self._names[self._check(index)]}.json"

    def _check(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.cells):
            raise IndexError(f"cell index {index!r} is out of range: this grid has cells 0-{len(self.cells) - 1}")
        return index

    def run(self, index: int, overwrite: bool = False) -> dict[str, Any]:
        """Run cell ``index`` in this process and write its result file; returns the result.

        Raises ``FileExistsError`` (one line) if the cell already has a result and not ``overwrite``.
        """
        path = self.path(index)
        if path.exists() and not overwrite:
            raise FileExistsError(f"cell {index} already has a result ({path}); pass --overwrite to run it again")
        result = self.run_cell(dict(self.cells[index]))
        try:
            text = json.dumps({"format": FORMAT, "index": index, "cell": self._canonical_cells[index],
                               "result": result}, indent=1)  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise TypeError(f"cell {index}: run_cell's result is not JSON-serialisable: {exc}") from None
        if path.exists() and not overwrite:  # another process finished it meanwhile: keep the first
            raise FileExistsError(f"cell {index} got a result from another process while it ran ({path}); kept that one")
        atomic_write_text(path, text + "\n")
        return _canonical(result)

    def missing(self) -> list[int]:
        """The indices of the cells without a result file, in order."""
        return [i for i in range(len(self.cells)) if not self.path(i).exists()]

    def run_missing(self, jobs: int = 1) -> list[int]:
        """Run every unfinished cell, each in a fresh process, at most ``jobs`` at a time.

        Uses ``ProcessPoolExecutor`` with the ``spawn`` start method and one cell per worker process
        (as an array task would). A failing cell is reported and the others carry on; the failures are
        raised together at the end (``RuntimeError``). Returns the indices that were run.
        """
        if int(jobs) < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        todo = self.missing()
        if not todo:
            return []
        failed: dict[int, str] = {}
        done = 0
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(int(jobs), len(todo)), mp_context=ctx, max_tasks_per_child=1) as pool:
            futures = {pool.submit(_run_in_worker, self, i): i for i in todo}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    future.result()
                except BaseException as exc:  # noqa: BLE001 — reported below; the other cells carry on
                    failed[i] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    print(f"[grid] cell {i} failed: {failed[i]}", file=sys.stderr, flush=True)
                else:
                    done += 1
                    print(f"[grid] cell {i} done ({done} of {len(todo)})", file=sys.stderr, flush=True)
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(todo)} cells failed ({array_spec(sorted(failed))}); the others "
                               f"are saved — rerun `{self.command} --jobs {jobs}` to retry the missing ones")  # fmt: skip
        return todo

    def finished(self) -> dict[int, dict[str, Any]]:
        """The results of the cells that have one, by index (checked as :meth:`collect` does): what a
        table of a grid that is still running (or was stopped) can show."""
        return {i: self._read(i) for i in range(len(self.cells)) if self.path(i).exists()}

    def collect(self) -> list[dict[str, Any]]:
        """The results of all cells, in cell order.

        Raises ``ValueError`` (one line) if cells are missing (listing them and the command that runs
        them) or if a result file was written for settings other than this grid's cell.
        """
        missing = self.missing()
        if missing:
            spec = array_spec(missing)
            raise ValueError(f"{len(missing)} of {len(self.cells)} cells have no result yet (cells {spec} in "
                             f"{self.out_dir}): run them with `{self.command} --jobs N`, or as an array job "
                             f"`--array={spec}` running `{self.command} --cell $SLURM_ARRAY_TASK_ID`")  # fmt: skip
        return [self._read(i) for i in range(len(self.cells))]

    def _read(self, i: int) -> dict[str, Any]:
        """Cell ``i``'s result, refused (one line) when the file was written for other settings."""
        want = self._canonical_cells[i]
        path = self.path(i)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cell {i}: cannot read {path}: {exc}") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT or "result" not in record:
            raise ValueError(f"cell {i}: {path} is not a {FORMAT} result file")
        if record.get("cell") != want:  # a file copied or edited by hand: its name no longer fits its settings
            raise ValueError(f"cell {i}: {path} holds the result of other settings "
                             f"({json.dumps(record.get('cell'), sort_keys=True)}), not this cell's "
                             f"{json.dumps(want, sort_keys=True)}: rerun it with "
                             f"`{self.command} --cell {i} --overwrite`")  # fmt: skip
        return record["result"]


def _run_in_worker(grid: Grid, index: int) -> None:
    """One cell in a worker process (module level, so the ``spawn`` pool can pickle it)."""
    try:
        grid.run(index)
    except BaseException as exc:  # noqa: BLE001 — re-raised as one line, with the traceback printed here
        # The worker's traceback would otherwise be lost in the parent's one-line report.
        traceback.print_exc(file=sys.stderr)
        raise RuntimeError(f"{type(exc).__name__}: {exc}".splitlines()[0]) from None


def add_grid_arguments(parser: argparse.ArgumentParser, default_dir: str | Path) -> argparse.ArgumentParser:
    """Add ``--cell``, ``--missing``, ``--jobs``, ``--collect`` (one of them at most), ``--grid-dir``
    and ``--overwrite`` to ``parser``; with none of the first four the script runs its serial loop."""
    group = parser.add_argument_group("grid (each cell as its own process; pyro_invariance.infer.grid)")
    mode = group.add_mutually_exclusive_group()
    mode.add_argument("--cell", nargs="?", const="env", default=None, metavar="INDEX",
                      help="run cell INDEX in this process; with no value, the array task's index from "
                           "$SLURM_ARRAY_TASK_ID (or PBS, LSF, SGE's variable)")  # fmt: skip
    mode.add_argument("--missing", nargs="?", const=0, default=None, type=int, metavar="BASE",
                      help="print the unfinished cells as a job-array spec (e.g. 0-3,7,9) and exit; "
                           "BASE=1 for LSF and SGE, whose indices start at 1")  # fmt: skip
    mode.add_argument("--jobs", type=int, default=None, metavar="N",
                      help="run the unfinished cells locally, N processes at a time, then collect")
    mode.add_argument("--collect", action="store_true", help="assemble the results of all cells")
    group.add_argument("--grid-dir", type=Path, default=Path(default_dir),
                       help=f"directory of the cells' result files (default {default_dir})")  # fmt: skip
    group.add_argument("--overwrite", action="store_true", help="with --cell: run a finished cell again")
    return parser


def run_grid_command(grid: Grid, args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Do what the grid flags of ``args`` ask (see :func:`add_grid_arguments`).

    Returns the collected results for ``--collect`` and ``--jobs``, else ``None`` (after ``--cell`` or
    ``--missing``, and when no grid flag was given: then the caller runs its serial loop).
    """
    if args.overwrite and args.cell is None:
        raise ValueError("--overwrite applies to --cell only (--jobs never reruns a finished cell)")
    if args.cell is not None:
        if args.cell == "env":
            index = cell_index_from_env()
            if index is None:
                raise ValueError("--cell without a value needs an array job's index: none of "
                                 + ", ".join(n for n, _ in ENV_INDEX_VARIABLES) + " is set")  # fmt: skip
        else:
            try:
                index = int(args.cell)
            except ValueError:
                raise ValueError(f"--cell {args.cell!r}: expected a cell index (an integer)") from None
        grid.run(index, overwrite=args.overwrite)
        print(f"[grid] cell {index} written to {grid.path(index)}", file=sys.stderr, flush=True)
        return None
    if args.missing is not None:
        missing = grid.missing()
        if not missing:
            print(f"[grid] all {len(grid)} cells have results in {grid.out_dir}", file=sys.stderr)
        print(array_spec(missing, base=args.missing), flush=True)
        return None
    if args.jobs is not None:
        grid.run_missing(args.jobs)
        return grid.collect()
    if args.collect:
        return grid.collect()
    return None

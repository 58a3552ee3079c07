"""Why the full-rank guide and basis regression carry their own training defaults.

The full-rank guide (``AutoMultivariateNormal``) on the conjugate basis-regression entry, whose exact
log evidence log Z is known: the gap ``log Z − ELBO`` after 500 steps of ``pi.fit`` for the library's
covariance-factor rate (``factor_lr = 1e-3``, chosen for the block-Cholesky guide) and for 0.05, with
1 and 4 ELBO particles per step, over seeds 0, 1, 2. The ELBO is estimated with 1000 particles in the
``E_q[log p(y, w) − log q(w)]`` form (Monte-Carlo error < 0.05 nats near the exact posterior).

Data and model (the reference configuration of ``tests/test_evidence.py``): ``make_symmetric_toy(40,
seed=3, noise=0.3, even=True, num_outputs=3)``; ``basis-regression`` with ``in_features=1,
out_features=3, num_features=8, lengthscale=0.6, prior_scale=0.5, noise_scale=0.3`` (λ = 1 fixed).
Other settings: the library defaults (lr 0.05, batch 128 ≥ N = 40 so full batch, cosine schedule,
mean-field ELBO), guide ``init_scale`` 1.0.

    .venv/bin/python benchmarks/full_rank_defaults.py     # writes results/full_rank_defaults.md (≈ 3 min)

The table is a grid of 12 independent cells (setting × seed; each fit seeds itself), so it also runs
as array jobs through :mod:`pyro_invariance.infer.grid` with the same numbers (cell results in
``--grid-dir``, default ``results/grids/full_rank_defaults``, git-ignored)::

    .venv/bin/python benchmarks/full_rank_defaults.py --jobs 2      # unfinished cells, 2 processes; then the table
    .venv/bin/python benchmarks/full_rank_defaults.py --cell 5      # one cell (an array task)
    .venv/bin/python benchmarks/full_rank_defaults.py --missing     # unfinished cells as an array spec
    .venv/bin/python benchmarks/full_rank_defaults.py --collect     # the table from the cells' results
    sbatch --array=$(.venv/bin/python benchmarks/full_rank_defaults.py --missing) \\
        --wrap ".venv/bin/python benchmarks/full_rank_defaults.py --cell \\$SLURM_ARRAY_TASK_ID"

``--stem`` names the output (e.g. ``full_rank_defaults_grid``); a table written under another stem
says whether its numbers equal those of ``full_rank_defaults.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402

import torch  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.diagnostics.evaluation import elbo_per_datum  # noqa: E402
from pyro_invariance.infer.grid import Grid, add_grid_arguments, run_grid_command  # noqa: E402
from pyro_invariance.models.basis_regression import make_symmetric_toy  # noqa: E402

N, STEPS, SEEDS = 40, 500, (0, 1, 2)
MODEL = dict(in_features=1, out_features=3, num_features=8, lengthscale=0.6, prior_scale=0.5, noise_scale=0.3)
SETTINGS = [  # (label, FitConfig overrides)
    ("factor_lr 1e-3, 1 particle (library defaults)", dict(factor_lr=1e-3, num_particles=1)),
    ("factor_lr 0.05, 1 particle (full-rank's fit_defaults)", dict(factor_lr=0.05, num_particles=1)),
    ("factor_lr 1e-3, 4 particles", dict(factor_lr=1e-3, num_particles=4)),
    ("factor_lr 0.05, 4 particles (what pi.fit now resolves)", dict(factor_lr=0.05, num_particles=4)),
]


STEM = "full_rank_defaults"
GRID_DIR = common.REPO_ROOT / "results" / "grids" / STEM
CELLS = [{"setting": label, "overrides": overrides, "seed": seed, "steps": STEPS}
         for label, overrides in SETTINGS for seed in SEEDS]  # fmt: skip


def gap(x: torch.Tensor, y: torch.Tensor, seed: int, overrides: dict[str, Any], steps: int = STEPS) -> float:
    """``log Z − ELBO`` (nats, all N points) after ``steps`` steps of the full-rank guide."""
    model = pi.models.get("basis-regression", **MODEL)
    result = pi.fit(model, "full-rank", (x, y), steps=steps, progress=False, seed=seed, **overrides)
    elbo = N * elbo_per_datum(model, result.guide, x, y, num_particles=1000, meanfield=False)
    with torch.no_grad():
        return float(model.log_evidence(x, y)) - elbo


def run_cell(cell: dict[str, Any]) -> dict[str, float]:
    """One cell of the table (one setting, one seed), self-contained: 1 thread, its own data and seed."""
    common.set_threads(1)
    x, y = make_symmetric_toy(N, seed=3, noise=0.3, even=True, num_outputs=3)
    return {"gap": gap(x, y, cell["seed"], cell["overrides"], cell["steps"])}


def _shown(path: Path) -> str:
    """``path`` relative to the repository root when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(common.REPO_ROOT))
    except ValueError:
        return str(path)


def publish(results: list[dict[str, float]], stem: str, out_dir: Path | None, grid_note: str = "",
            compare_to: Path | None = None) -> None:  # fmt: skip
    """The table and its JSON from the cells' results (in ``CELLS`` order)."""
    gaps_of = {label: [r["gap"] for c, r in zip(CELLS, results) if c["setting"] == label] for label, _ in SETTINGS}
    rows, payload = [], {}
    for label, overrides in SETTINGS:
        gaps = gaps_of[label]
        payload[label] = {"overrides": overrides, "gaps": gaps}
        rows.append([label, *(f"{g:.2f}" for g in gaps), f"{statistics.mean(gaps):.2f} ± {statistics.stdev(gaps):.2f}"])
    settings = {"data": f"make_symmetric_toy({N}, seed=3, noise=0.3, even=True, num_outputs=3)",
                "model": f"basis-regression {MODEL}", "guide": "full-rank (init_scale 1.0)", "steps": STEPS,
                "seeds": list(SEEDS), "ELBO estimate": "1000 particles, E_q[log p(y,w) - log q(w)]"}  # fmt: skip
    record = {"settings": settings, "results": payload}
    intro = __doc__.split("\n\n")[0]
    if grid_note:
        intro += "\n\n" + grid_note
        published = (Path(out_dir) if out_dir else common.RESULTS_DIR) / f"{STEM}.json"
        others = [p for p in (compare_to, published if stem != STEM else None) if p is not None and p.exists()]
        for serial in dict.fromkeys(p.resolve() for p in others):
            same = json.loads(json.dumps(record, default=str)) == json.loads(serial.read_text())
            intro += (f" Same settings and numbers as the serial run's `{_shown(serial)}` (identical JSON; compared when "
                      f"this file was written)." if same else f" The numbers DIFFER from the serial run's "
                      f"`{_shown(serial)}` (compared when this file was written: a serial run of other code?).")  # fmt: skip
            common.log(f"same settings and numbers as {serial}: {same}")
    markdown = common.header_markdown(
        "Full-rank guide on basis regression: gap to the exact log evidence after 500 steps",
        common.machine_info(), settings, common.command_line(), intro,
    ) + "\n" + common.md_table(["settings", *(f"seed {s}" for s in SEEDS), "mean ± sd"], rows) + "\n"
    common.write_results(stem, markdown, record, out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stem", default=STEM, help=f"output name: <out-dir>/<stem>.md and .json (default {STEM})")
    parser.add_argument("--out-dir", type=Path, default=None, help="output directory (default benchmarks/results)")
    parser.add_argument("--compare-to", type=Path, default=None,
                        help=f"with --collect/--jobs: a serial run's JSON to compare the numbers with (under another "
                             f"--stem, <out-dir>/{STEM}.json is compared too)")  # fmt: skip
    add_grid_arguments(parser, default_dir=GRID_DIR)
    args = parser.parse_args()
    if args.compare_to is not None and not args.compare_to.exists():
        sys.exit(f"error: --compare-to {args.compare_to}: no such file")
    common.set_threads(1)
    command = ".venv/bin/python benchmarks/full_rank_defaults.py"
    if args.grid_dir.resolve() != GRID_DIR.resolve():
        command += f" --grid-dir {args.grid_dir}"
    grid = Grid(CELLS, run_cell, args.grid_dir, command=command)
    try:
        results = run_grid_command(grid, args)
    except (ValueError, IndexError, TypeError, FileExistsError, RuntimeError) as exc:
        sys.exit(f"error: {exc}")
    if results is not None:  # --jobs or --collect
        note = (f"Produced through the grid runner (`pyro_invariance.infer.grid`): each of the {len(CELLS)} cells "
                f"(setting × seed) ran as its own process and wrote its result to `{_shown(args.grid_dir)}`; this "
                f"table was assembled from those files by `--collect` (which `--jobs` ends with).")  # fmt: skip
        publish(results, args.stem, args.out_dir, note, args.compare_to)
    elif args.cell is None and args.missing is None:  # serial, in this process
        results = []
        for i, cell in enumerate(CELLS):
            results.append(run_cell(cell))
            common.log(f"cell {i}: {cell['setting']}, seed {cell['seed']}: gap {results[-1]['gap']:.2f}")
        publish(results, args.stem, args.out_dir)


if __name__ == "__main__":
    main()

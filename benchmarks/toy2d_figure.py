"""Paper 003, Fig. 1: extrapolation of the 2-D rotation toy with no, some and full (and learned) invariance.

Fits the catalogue model ``rotation-toy-2d`` (``models/toy2d.py``) on
:func:`pyro_invariance.data.toy2d.make_rotation_toy` at fixed η = 0, π/2 and π (and, with ``--learned``,
with η learned by the ELBO from 0.1), prints the accuracy
inside / outside the training sector, the test NLL and the ELBO, and writes the figure ``OUT/extrapolation.png``
(:func:`pyro_invariance.data.toy2d.plot_extrapolation`) and ``OUT/results.json``::

    .venv/bin/python benchmarks/toy2d_figure.py --out results/toy2d [--steps N] [--guide G] [--learned] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import pyro_invariance as pi
from pyro_invariance import guides  # noqa: F401  (registers the guides fit() takes by name)
from pyro_invariance.data.toy2d import (
    Toy2DDataset,
    in_sector,
    make_rotation_toy,
    plot_extrapolation,
    predictive_probabilities,
)
from pyro_invariance.diagnostics.evaluation import elbo_per_datum
from pyro_invariance.diagnostics.plots import save_figure

#: The panels of paper 003's Fig. 1: label and fixed η.
FIGURE_SETTINGS: tuple[tuple[str, float | None], ...] = (
    ("no invariance (η = 0)", 0.0),
    ("some invariance (η = π/2)", math.pi / 2),
    ("full invariance (η = π)", math.pi),
)
#: The extra panel of ``--learned``: η learned from 0.1 by the ELBO (``None``).
LEARNED_SETTING: tuple[str, float | None] = ("learned η", None)


def _accuracies(model: Any, guide: Any, data: Toy2DDataset, num_samples: int) -> dict[str, float]:
    probs = predictive_probabilities(model, guide, data.x_test, num_samples=num_samples)
    correct = (probs.argmax(-1) == data.y_test).double()
    inside = in_sector(data.x_test, data.info["sector"], data.info["center"])
    nll = -probs[torch.arange(len(data.y_test)), data.y_test].clamp_min(1e-12).log()
    return {
        "acc_in_sector": float(correct[inside].mean()) if inside.any() else float("nan"),
        "acc_outside": float(correct[~inside].mean()) if (~inside).any() else float("nan"),
        "test_nll": float(nll.mean()),
    }


@pi.pyro_scope()
def run_figure(
    out: str | Path,
    steps: int = 1500,
    guide: str = "full-rank",
    seed: int = 0,
    settings: Sequence[tuple[str, float | None]] = FIGURE_SETTINGS,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Fit ``rotation-toy-2d`` at each setting, write ``extrapolation.png`` and ``results.json`` to ``out``."""
    out = Path(out)
    data = make_rotation_toy()
    panels, rows = {}, []
    for label, eta in settings:
        kwargs = (
            {"learn_symmetry": True, "eta_init": 0.1} if eta is None else {"learn_symmetry": False, "eta_init": eta}
        )
        model = pi.models.get("rotation-toy-2d", **kwargs)
        start = time.perf_counter()
        result = pi.fit(
            model, guide, data, steps=steps, batch_size=None, lr=0.02, factor_lr=0.02, seed=seed, progress=progress
        )
        seconds = time.perf_counter() - start
        metrics = _accuracies(result.model, result.guide, data, num_samples=64)
        metrics["elbo_per_datum"] = elbo_per_datum(
            result.model, result.guide, data.x_train, data.y_train, num_particles=32
        )
        eta_value = float(result.eta["rot"])
        panel_label = label if eta is not None else f"learned η = {eta_value:.2f}"
        panels[panel_label] = result
        rows.append({"label": label, "eta": eta_value, "seconds": seconds, **metrics})
        log(
            f"{label:28s} η={eta_value:5.3f}  acc in sector {metrics['acc_in_sector']:.3f}  "
            f"outside {metrics['acc_outside']:.3f}  test NLL {metrics['test_nll']:.3f}  "
            f"ELBO/N {metrics['elbo_per_datum']:.3f}  {seconds:.0f}s"
        )
    fig = plot_extrapolation(panels, data=data, title=f"rotation-toy-2d, {guide} guide, {steps} steps")
    figure = save_figure(fig, out / "extrapolation.png", dpi=120, bbox_inches="tight")
    payload = {"guide": guide, "steps": steps, "seed": seed, "rows": rows, "data": data.info}
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    log(f"wrote {figure} and {out / 'results.json'}")
    return {"rows": rows, "figure": str(figure)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/toy2d_figure.py",
        description="Paper 003 Fig. 1: extrapolation of the 2-D rotation toy with no / some / full "
        "(/ learned) invariance.",
    )
    parser.add_argument("--out", default="results/toy2d", help="output folder (default results/toy2d)")
    parser.add_argument("--steps", type=int, default=1500, help="SVI steps per model (default 1500)")
    parser.add_argument("--guide", default="full-rank", help="guide name (default full-rank)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="100 steps (a smoke test)")
    parser.add_argument("--learned", action="store_true", help="add a panel with η learned by the ELBO")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = FIGURE_SETTINGS + ((LEARNED_SETTING,) if args.learned else ())
    run_figure(args.out, steps=100 if args.quick else args.steps, guide=args.guide, seed=args.seed, settings=settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time per training step: ODE-flow (non-quadratic, ``symmetry="neural"``) vs matrix-exponential (quadratic) symmetry samples (issue 13).

The symmetrised HNN on Kepler-sized states (M = 4, hidden (64, 64), E = 5 Euler sub-steps, batch 100,
K = 3 quantities, ball sampling, matrix-normal guide), at S = 8 and S = 32 symmetry samples; the
learned non-quadratic C (32 hidden units + a quadratic form) with 4 and 8 RK4 steps per flow; the plain
HNN for reference. ``fit``'s own loop: ``warmup`` untimed steps, then the mean of ``steps`` timed steps,
all variants in one process (ratios within one run).

    .venv/bin/python benchmarks/noether_flow_step_time.py [--steps 10] [--warmup 2]

writes ``benchmarks/results/noether_flow_step_time.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

BASE = {"hidden": (64, 64), "euler_steps": 5, "num_generators": 3, "sampling": "ball"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    _common.set_threads(args.threads)

    import pyro
    import torch

    from pyro_invariance import guides
    from pyro_invariance.models.symmetrised_hnn import SymmetrisedHNN

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(100, 4, generator=gen)
    y = x + 0.05 * torch.randn(100, 4, generator=gen)
    variants = [("HNN", 8, {"symmetry": "none"})]
    for s in (8, 32):
        variants.append((f"quadratic (expm), S = {s}", s, {"symmetry": "quadratic"}))
        for n in (4, 8):
            variants.append((f"non-quadratic (RK4 × {n}), S = {s}", s, {"symmetry": "neural", "flow_steps": n,
                                                                        "conserved_hidden": (32,)}))  # fmt: skip
    rows = []
    for label, s, extra in variants:
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        kw = dict(BASE, **extra)
        if extra["symmetry"] == "none":
            kw.pop("num_generators"), kw.pop("sampling")
        model = SymmetrisedHNN(4, num_transforms=s, dt=0.5, **kw)
        guide = guides.get("matrix-normal", model, init_scale=0.01)
        marks: list[float] = []
        import pyro_invariance as pi

        pi.fit(model, guide, (x, y), steps=args.warmup + args.steps, batch_size=None, progress=False, seed=0,
               callbacks=[lambda step, m, g: marks.append(time.perf_counter())])  # fmt: skip
        per_step = (marks[-1] - marks[args.warmup - 1]) / args.steps if args.warmup >= 1 else float("nan")
        rows.append({"variant": label, "S": s, "s_per_step": per_step})
        _common.log(f"{label}: {per_step * 1e3:.0f} ms/step")
    quad = {r["S"]: r["s_per_step"] for r in rows if r["variant"].startswith("quadratic")}
    table = [[r["variant"], f"{r['s_per_step'] * 1e3:.0f}",
              f"{r['s_per_step'] / quad[r['S']]:.1f}×" if r["variant"] != "HNN" else "–"] for r in rows]  # fmt: skip
    settings = {**BASE, "state_dim": 4, "batch": 100, "timed_steps": args.steps, "warmup": args.warmup}
    md = _common.header_markdown("Symmetrised HNN: ODE-flow vs matrix-exponential symmetry samples, time per step",
                                 _common.machine_info(), settings, _common.command_line(), __doc__.split("\n\n")[1])  # fmt: skip
    md += "\n" + _common.md_table(["variant", "ms/step", "vs quadratic at the same S"], table) + "\n"
    _common.publish("noether_flow_step_time", md, {"settings": settings, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

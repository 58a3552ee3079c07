"""Cost of one Laplace curvature update per layer type: KFAC (exact labels, sampled labels) vs the diagonal GGN (issue 12).

For every layer-wise variant at α = 2 on 16-px inputs (10 classes, ``--num-data`` random images,
minibatches of 32): seconds for one curvature pass over the data (``kfac_curvature`` with
``labels="exact"``, C backward passes per minibatch; ``labels="sampled"``, one; ``diagonal_ggn``
with one label draw, one) plus the δ update that follows (KFAC: the eigendecompositions and 100
Adam steps on log δ; diagonal: MacKay's update), and the peak resident memory of a fresh process
doing it (``ru_maxrss``; each (variant, method) in its own subprocess, so the peak is its own; the
idle baseline of such a process is in the JSON). Ratios are within one run on one machine.

Results: ``benchmarks/results/kfac_update_cost[_quick].md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402

VARIANTS = ("fc", "conv", "fc+conv", "f-fc+conv", "s-fc+s-conv", "fc+conv+gconv")
METHODS = ("diagonal", "kfac-sampled", "kfac-exact")


def child(variant: str, method: str, num_data: int, repeats: int) -> None:
    """In a fresh process: one curvature + δ update, ``repeats`` times; prints a JSON line."""
    common.set_threads(1)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    import pyro
    import torch
    from pyro import poutine

    from pyro_invariance import guides
    from pyro_invariance.infer.kfac_layers import kfac_curvature
    from pyro_invariance.infer.laplace import diagonal_ggn, gradient_update, mackay_update
    from pyro_invariance.models.layerwise import LayerwiseNet, make_init_loc_fn

    pyro.set_rng_seed(0)
    model = LayerwiseNet(variant, (1, 16, 16), 10, alpha=2, prior="fixed")
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_data, 1, 16, 16, generator=gen)
    y = torch.randint(0, 10, (num_data,), generator=gen)
    guide = guides.get("map", model, init_loc_fn=make_init_loc_fn(model.arch, "prior"))
    with poutine.block():
        guide(x[:2], y[:2])
    values = {k: v.detach() for k, v in guide.median().items()}
    sites = [s for g in model.precision_groups() for s in g.sites]
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        if method == "diagonal":
            h = diagonal_ggn(model, values, x, sites, batch_size=32, generator=torch.Generator().manual_seed(r))
            mackay_update(model, values, h)
        else:
            curv = kfac_curvature(model, values, x, batch_size=32, labels=method.split("-")[1],
                                  generator=torch.Generator().manual_seed(r))  # fmt: skip
            gradient_update(model, values, curv, steps=100, lr=0.1)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"variant": variant, "method": method, "params": model.num_parameters(),
                      "seconds": sorted(times)[len(times) // 2], "peak_rss_mb": peak / 1024,
                      "model_loaded_rss_mb": loaded / 1024, "baseline_rss_mb": baseline / 1024}))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke-test size (128 images, one repeat)")
    p.add_argument("--num-data", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    num_data, repeats = (128, 1) if args.quick else (args.num_data, args.repeats)
    if args.child:
        child(*args.child, num_data, repeats)
        return
    rows = []
    for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
        for method in METHODS:
            cmd = [sys.executable, __file__, "--child", variant, method, "--num-data", str(num_data),
                   "--repeats", str(repeats)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            common.log(f"{variant} {method}: {rows[-1]['seconds']:.2f} s, peak {rows[-1]['peak_rss_mb']:.0f} MB")
    body = []
    for r in rows:
        diag = next(d for d in rows if d["variant"] == r["variant"] and d["method"] == "diagonal")
        body.append([r["variant"], f"{r['params']:,}", r["method"], f"{r['seconds']:.2f}",
                     f"{r['seconds'] / diag['seconds']:.1f}×", f"{r['peak_rss_mb']:.0f}",
                     f"{r['peak_rss_mb'] - r['model_loaded_rss_mb']:+.0f}"])  # fmt: skip
    settings = {"alpha": 2, "input": "1×16×16", "classes": 10, "num_data": num_data, "minibatch": 32,
                "repeats (median)": repeats, "threads": 1, "delta update": "KFAC: 100 Adam steps on log δ; diagonal: MacKay"}  # fmt: skip
    md = common.header_markdown("Layer-wise Laplace: cost of one curvature + δ update, KFAC vs diagonal",
                                common.machine_info(), settings, common.command_line(),
                                __doc__.split("\n\n")[1])  # fmt: skip
    md += "\n" + common.md_table(["variant", "params", "curvature", "seconds / update", "vs diagonal",
                                  "peak RSS (MB)", "peak above the loaded model (MB)"], body)  # fmt: skip
    common.write_results("kfac_update_cost" + ("_quick" if args.quick else ""), md,
                         {"settings": settings, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()

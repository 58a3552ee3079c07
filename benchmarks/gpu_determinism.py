"""GPU check: do layer-wise MAP / Laplace fits repeat and resume bit-for-bit on CUDA?

Run on a machine with a GPU (from the repository root, the package installed)::

    python benchmarks/gpu_determinism.py            # default kernels
    python benchmarks/gpu_determinism.py --deterministic   # pyro_invariance.infer.training.make_deterministic()

Fits ``layerwise-fc+conv`` (α = 2, 256 quadrant digits, 30 MAP steps with Laplace-evidence updates
every 10) twice, and once more split at step 15 and resumed from the checkpoint; prints whether δ,
weights and the log evidence agree exactly. Then (``--deterministic``) runs the CLI with
``--deterministic`` twice and compares the saved histories. Measured on an NVIDIA H200 (torch 2.11):
default kernels — two identical runs already differ (so does a plain MAP fit); deterministic —
repeats, resumed runs and the CLI histories are bit-identical.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyro
import torch

from pyro_invariance.infer.laplace import fit_laplace
from pyro_invariance.models.layerwise import LayerwiseNet
from pyro_invariance.data.quadrant import build_quadrant_dataset
from pyro_invariance.infer.training import make_deterministic


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    if args.deterministic:
        make_deterministic()
    data = build_quadrant_dataset("digits", 10)
    x, y = data.x_train[:256], data.y_train[:256]
    tmp = Path(tempfile.mkdtemp())

    def run(**kw):
        pyro.set_rng_seed(0)
        model = LayerwiseNet("fc+conv", (1, 16, 16), 10, alpha=2, prior="fixed")
        result = fit_laplace(model, "map", (x, y), steps=30, every=10, warmup=10, batch_size=64, progress=False, lr=1e-2,
                             device=args.device, curvature="diagonal", delta_update="mackay", **kw)  # fmt: skip
        return model, result

    def same(a, b) -> bool:
        (ma, ra), (mb, rb) = a, b
        ga, gb = ra.guide.median(), rb.guide.median()
        deltas = zip(ma.symmetry_summary().values(), mb.symmetry_summary().values())
        return (all(torch.equal(u, v) for u, v in deltas) and all(torch.equal(ga[k], gb[k]) for k in ga)
                and ra.log_evidence == rb.log_evidence)  # fmt: skip

    first, second = run(), run()
    run(checkpoint_path=tmp / "ck.pt", until_step=15)
    resumed = run(checkpoint_path=tmp / "ck.pt", resume=True)
    print(f"deterministic={args.deterministic}: repeat identical {same(first, second)}, "
          f"resumed identical {same(first, resumed)}")  # fmt: skip
    if args.deterministic:
        cli = ["fit", "--model", "layerwise-fc+conv", "--objective", "laplace", "--data", "quadrant-digits",
               "--device", args.device, "--deterministic", "--steps", "30", "--laplace-every", "10",
               "--laplace-warmup", "10", "--model-arg", "alpha=2", "--train-size", "300", "--no-progress",
               "--eval-samples", "1"]  # fmt: skip
        histories = []
        for name in ("r1", "r2"):
            code = f"import sys; from pyro_invariance.cli import main; sys.exit(main({cli + ['--out', str(tmp / name)]!r}))"
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            histories.append(json.loads((tmp / name / "result.json").read_text())["history"])
        print(f"CLI --deterministic: identical histories {histories[0] == histories[1]}")


if __name__ == "__main__":
    main()

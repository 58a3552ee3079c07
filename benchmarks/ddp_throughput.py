"""Data-parallel SVI: time per step of 1 process vs 2 ranks, same shards, same numbers (issue 16).

Three runs of ``pi.fit`` on the invariant MLP (block-Cholesky guide, learned rotation) with the same
global minibatch, interleaved ``--reps`` times so that load from other jobs hits them alike:

* ``1 process, 1 shard`` — the plain run (one weight draw per step on the whole minibatch);
* ``1 process, 2 shards`` — what 2 ranks compute, one shard after the other on one process;
* ``2 ranks, 2 shards`` — ``strategy="ddp"``: 2 processes (``torch.multiprocessing.spawn``; the
  ``gloo`` backend, or ``--backend nccl`` for 2 GPUs), one shard each, gradients averaged by
  DistributedDataParallel. On one GPU (``--device cuda --backend gloo``) both ranks share the card:
  a *simulated* 2-rank run, which measures the overhead of the data-parallel step, not a speed-up.

A step's time is the median interval between consecutive steps (a ``fit`` callback on rank 0, after a
device synchronisation on CUDA) over the steps after ``--warmup``. The table also gives the largest
difference between the per-step losses of the 1-process 2-shard run and the 2-rank run (the same
numbers up to float rounding, ``tests/test_distributed.py``).

    .venv/bin/python benchmarks/ddp_throughput.py                      # CPU, 2 processes of 1 thread
    .venv/bin/python benchmarks/ddp_throughput.py --hidden 1024 --transforms 16 --batch 512 --steps 25 \
        --out ddp_throughput_large                                     # a compute-bound step
    .venv/bin/python benchmarks/ddp_throughput.py --device cuda --out ddp_throughput_cuda
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"data": f"rotated-digits (8×8), {args.train_size} training images", "model": "invariant-mlp",
            "hidden": args.hidden, "num_transforms (S)": args.transforms, "guide": "block-cholesky",
            "global batch": args.batch, "steps per run": args.steps, "warm-up steps (not timed)": args.warmup,
            "repetitions": args.reps, "device": args.device, "backend": args.backend, "threads per process": 1}  # fmt: skip


def one_fit(args: argparse.Namespace, **kw: Any) -> tuple[list[float], list[float]]:
    """A fit; returns (its per-step ELBO history, the step intervals after the warm-up, in seconds)."""
    import pyro_invariance as pi
    from pyro_invariance.data.images import load_dataset

    data = load_dataset("rotated-digits", train_size=args.train_size, test_size=16)
    model = pi.models.get("invariant-mlp", image_shape=(1, 8, 8), hidden=args.hidden, num_transforms=args.transforms)
    stamps: list[float] = []
    cuda = args.device.startswith("cuda")

    def clock(step: int, model: Any, guide: Any) -> None:
        if cuda:
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    res = pi.fit(model, "block-cholesky", data, steps=args.steps, batch_size=args.batch, seed=0, progress=False,
                 device=args.device, log_every=args.steps, callbacks=[clock], **kw)  # fmt: skip
    gaps = [b - a for a, b in zip(stamps[args.warmup:], stamps[args.warmup + 1:])]
    return res.history["elbo"], gaps


def rank_main(rank: int, world: int, args: argparse.Namespace, rendezvous: str, out: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(args.backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        elbo, gaps = one_fit(args, strategy="ddp", shards=2)
        if rank == 0:
            torch.save({"elbo": elbo, "gaps": gaps}, out)
    finally:
        torch.distributed.destroy_process_group()


def two_ranks(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        mp.spawn(rank_main, args=(2, args, os.path.join(tmp, "rendezvous"), out), nprocs=2, join=True)
        record = torch.load(out, weights_only=True)
    return record["elbo"], record["gaps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--train-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default="ddp_throughput", help="results file stem (benchmarks/results/<out>.md/.json)")
    args = parser.parse_args()
    common.set_threads(1)
    runs: dict[str, list[float]] = {"1 process, 1 shard": [], "1 process, 2 shards": [], "2 ranks, 2 shards": []}
    max_diff = 0.0
    for rep in range(args.reps):
        order = list(runs)[rep % 3:] + list(runs)[:rep % 3]
        histories = {}
        for name in order:
            if name == "2 ranks, 2 shards":
                histories[name], gaps = two_ranks(args)
            else:
                histories[name], gaps = one_fit(args, shards=1 if name.endswith("1 shard") else 2)
            runs[name].append(statistics.median(gaps))
            common.log(f"rep {rep} {name}: {1e3 * runs[name][-1]:.1f} ms/step")
        a, b = histories["1 process, 2 shards"], histories["2 ranks, 2 shards"]
        max_diff = max(max_diff, max(abs(u - v) for u, v in zip(a, b)))
    base = statistics.median(runs["1 process, 1 shard"])
    rows = [[name, f"{1e3 * statistics.median(t):.1f}", " / ".join(f"{1e3 * v:.1f}" for v in t),
             f"{statistics.median(t) / base:.2f}×"] for name, t in runs.items()]  # fmt: skip
    intro = (__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1] + "\n\n"
             f"Largest difference between the per-step ELBO/N of the 1-process 2-shard run and the 2-rank run, "
             f"over all repetitions: {max_diff:.2e}.")  # fmt: skip
    markdown = common.header_markdown("Data-parallel SVI: time per step, 1 process vs 2 ranks", common.machine_info(),
                                      settings_of(args), common.command_line(), intro)  # fmt: skip
    markdown += "\n" + common.md_table(["run", "ms/step (median)", "per repetition", "vs 1 shard"], rows) + "\n"
    common.write_results(args.out, markdown, {"settings": settings_of(args), "ms_per_step": {k: [1e3 * v for v in t]
                         for k, t in runs.items()}, "max_elbo_difference": max_diff})  # fmt: skip


if __name__ == "__main__":
    main()

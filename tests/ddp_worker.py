"""What each rank of the 2-process data-parallel tests runs (``tests/infer/test_distributed.py``).

One spawn of 2 CPU processes (``gloo``) runs every scenario, so the processes start once; rank 0
saves what the test compares with a one-process run to ``<tmp>/<name>.pt``.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pyro
import torch

SHAPE = (1, 8, 8)


def layerwise_setup() -> tuple[Any, Any, Any, Any]:
    """A small FC+CONV network with fixed precisions, its MAP guide and 40 random 8×8 images."""
    from pyro import poutine

    from pyro_invariance import guides
    from pyro_invariance.models.layerwise import LayerwiseNet, make_init_loc_fn

    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(40, *SHAPE, generator=g), torch.randint(0, 3, (40,), generator=g)
    pyro.set_rng_seed(0)
    model = LayerwiseNet("fc+conv", SHAPE, 3, alpha=1, prior="fixed")
    guide = guides.get("map", model, init_loc_fn=make_init_loc_fn(model.arch, "prior"))
    with poutine.block():
        guide(x[:2], y[:2])
    return model, guide, x, y


def laplace_run(**kw: Any) -> Any:
    """``fit_laplace`` of a small FC+CONV network (KFAC, gradient δ updates every 4 steps)."""
    from pyro_invariance.infer.laplace import fit_laplace
    from pyro_invariance.models.layerwise import LayerwiseNet

    _, _, x, y = layerwise_setup()
    pyro.set_rng_seed(0)
    model = LayerwiseNet("fc+conv", SHAPE, 3, alpha=1, prior="fixed")
    res = fit_laplace(
        model,
        "map",
        (x, y),
        steps=12,
        every=4,
        warmup=4,
        ggn_batch_size=8,
        batch_size=16,
        progress=False,
        lr=1e-2,
        delta_steps=5,
        **kw,
    )
    return {
        "delta": {k: v.detach().clone() for k, v in model.symmetry_summary().items()},
        "log_evidence": res.log_evidence,
        "elbo": res.history["elbo"],
    }


def run(rank: int, world: int, tmp: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    from small_runs import fit_state, small_digits, small_fit

    from pyro_invariance.infer.bounds import log_weights
    from pyro_invariance.infer.distributed import current_ranks
    from pyro_invariance.infer.laplace import LaplaceEvidenceUpdate

    out = Path(tmp)

    def save(name: str, obj: Any) -> None:
        if rank == 0:
            torch.save(obj, out / f"{name}.pt")

    data = small_digits()
    ddp = {"strategy": "ddp", "shards": 2, "log_every": 4}
    # 1. a whole run, and the same run split at step 6 and resumed on 2 ranks
    res = small_fit(data, checkpoint_path=out / "whole.ckpt", **ddp)
    save("whole", {"elbo": res.history["elbo"], "state": fit_state(res), "eta": res.history["eta"]})
    small_fit(data, checkpoint_path=out / "split.ckpt", until_step=6, **ddp)
    if rank == 0:
        shutil.copy(out / "split.ckpt", out / "step6.ckpt")  # for the one-process resume
    torch.distributed.barrier()
    res = small_fit(data, checkpoint_path=out / "split.ckpt", resume=True, **ddp)
    save("resumed", {"elbo": res.history["elbo"], "state": fit_state(res)})
    # 2. refusals reach every rank: a shard count the ranks do not divide; an existing checkpoint
    errors = []
    for kw in ({"shards": 1}, {"checkpoint_path": out / "whole.ckpt"}):
        try:
            small_fit(data, **{**ddp, **kw})
        except Exception as exc:  # noqa: BLE001 - the test reads the message
            errors.append(f"{type(exc).__name__}: {exc}")
    save("errors", errors)
    # 3. the KFAC curvature and the log likelihood, each rank on its half of the rows
    model, guide, x, y = layerwise_setup()
    update = LaplaceEvidenceUpdate(x, y, batch_size=8)
    values, curv = update.compute_curvature(model, guide, step=1)
    save(
        "kfac",
        {
            "blocks": {b.sites: (b.factors.G, b.factors.A, b.factors.num_data) for b in curv.blocks},
            "log_lik": update.log_likelihood(model, values),
        },
    )
    # 4. Laplace-evidence training (curvature reduced over the ranks inside the fit)
    save("laplace", laplace_run(**ddp))
    # 5. log weights of the evidence bounds: each rank draws its share, all gathered
    res = small_fit(data, steps=3, **ddp)
    pyro.set_rng_seed(11)
    lw, _ = log_weights(res.model, res.guide, data.x_train[:64], data.y_train[:64], 7, ranks=current_ranks())
    save("log_weights", {"lw": lw, "state": fit_state(res)})
    # 6. SIGINT on rank 1 after step 3: both ranks stop together at the next bulk read (step 4)
    from pyro_invariance.infer.interrupts import FitInterrupted

    def interrupt(step: int, model: Any, guide: Any) -> None:
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    stopped = None
    try:
        small_fit(data, checkpoint_path=out / "interrupted.ckpt", callbacks=[interrupt], **ddp)
    except FitInterrupted as exc:
        stopped = exc.step
    res = small_fit(data, checkpoint_path=out / "interrupted.ckpt", resume=True, **ddp)
    save("interrupted", {"stopped": stopped, "elbo": res.history["elbo"], "state": fit_state(res)})
    torch.distributed.destroy_process_group()

"""Data-parallel SVI: 2 CPU processes (``gloo``) against one process, same numbers.

One module-scoped spawn runs every 2-rank scenario (``tests/ddp_worker.py``); each test compares
what rank 0 saved with a one-process run of the same shards and draws.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import ddp_worker
import pyro
import pytest
import torch
import torch.multiprocessing as mp
from small_runs import fit_state, small_digits, small_fit

from pyro_invariance.cli import main
from pyro_invariance.infer.bounds import ranked_log_weights
from pyro_invariance.infer.config import FitConfig
from pyro_invariance.infer.laplace import LaplaceEvidenceUpdate

torch.set_num_threads(1)

DDP_ONE_PROCESS = {"shards": 2, "log_every": 4}  # what 2 ranks compute, on one process


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    mp.spawn(ddp_worker.run, args=(2, str(tmp)), nprocs=2, join=True)
    return tmp


@pytest.fixture(scope="module")
def data():
    return small_digits()


def _load(tmp, name):
    return torch.load(tmp / f"{name}.pt", weights_only=True)


def _assert_close_states(a, b, **tol):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], **tol, msg=lambda m: f"{k}: {m}")


def test_two_ranks_give_the_one_process_trajectory(two_ranks, data):
    """A 2-rank fit (global batch 64, 2 shards of 32) = one process running both shards, same draws."""
    two = _load(two_ranks, "whole")
    one = small_fit(data, **DDP_ONE_PROCESS)
    assert len(two["elbo"]) == len(one.history["elbo"]) == 12
    torch.testing.assert_close(torch.tensor(two["elbo"]), torch.tensor(one.history["elbo"]), rtol=1e-5, atol=1e-5)
    _assert_close_states(two["state"], fit_state(one), rtol=1e-5, atol=1e-6)
    # the shards are not the single-stream run: with one shard the draws and the loss differ
    single = small_fit(data, log_every=4)
    assert single.history["elbo"][0] != pytest.approx(one.history["elbo"][0], abs=1e-3)


def test_two_rank_checkpoint_resumes_bit_for_bit_on_two_ranks(two_ranks):
    whole, resumed = _load(two_ranks, "whole"), _load(two_ranks, "resumed")
    assert whole["elbo"] == resumed["elbo"]
    assert all(torch.equal(whole["state"][k], resumed["state"][k]) for k in whole["state"])


def test_two_rank_checkpoint_resumes_on_one_process(two_ranks, data, tmp_path):
    ckpt = tmp_path / "step6.ckpt"
    shutil.copy(two_ranks / "step6.ckpt", ckpt)
    one = small_fit(data, checkpoint_path=ckpt, resume=True, **DDP_ONE_PROCESS)
    whole = _load(two_ranks, "whole")
    torch.testing.assert_close(torch.tensor(one.history["elbo"]), torch.tensor(whole["elbo"]), rtol=1e-5, atol=1e-5)
    _assert_close_states(fit_state(one), whole["state"], rtol=1e-5, atol=1e-6)
    # a checkpoint of other shards belongs to another run
    with pytest.raises(Exception, match="another run"):
        small_fit(data, checkpoint_path=ckpt, resume=True, shards=4, log_every=4)


def test_a_signal_on_one_rank_stops_both_at_the_same_step(two_ranks):
    """SIGINT on rank 1 after step 3: rank 0 stops too, at the next bulk read (log_every = 4), after
    the checkpoint; resuming it on 2 ranks gives the uninterrupted run bit-for-bit."""
    interrupted, whole = _load(two_ranks, "interrupted"), _load(two_ranks, "whole")
    assert interrupted["stopped"] == 4
    assert interrupted["elbo"] == whole["elbo"]
    assert all(torch.equal(whole["state"][k], interrupted["state"][k]) for k in whole["state"])


def test_cli_under_torchrun_matches_one_process(tmp_path):
    """``torchrun --nproc-per-node 2 -m pyro_invariance.cli fit ... --strategy ddp --shards 2``: rank 0
    alone writes the run, with the history of the one-process ``--shards 2`` run."""
    args = [
        "fit",
        "--model",
        "invariant-mlp",
        "--data",
        "digits",
        "--steps",
        "4",
        "--shards",
        "2",
        "--log-every",
        "2",
        "--model-arg",
        "hidden=16",
        "--model-arg",
        "num_transforms=4",
        "--train-size",
        "128",
        "--test-size",
        "32",
        "--no-progress",
        "--eval-samples",
        "2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "pyro_invariance.cli",
            *args,
            "--strategy",
            "ddp",
            "--out",
            str(tmp_path / "ddp"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert ddp.stdout.count("test acc") == 1  # the summary is printed once, by rank 0
    assert main([*args, "--out", str(tmp_path / "one")]) == 0  # one process, in this one
    h_ddp = json.loads((tmp_path / "ddp" / "result.json").read_text())["history"]["elbo"]
    h_one = json.loads((tmp_path / "one" / "result.json").read_text())["history"]["elbo"]
    assert len(h_ddp) == 4
    torch.testing.assert_close(torch.tensor(h_ddp), torch.tensor(h_one), rtol=1e-5, atol=1e-5)


def test_refusals_reach_every_rank(two_ranks):
    bad_shards, existing = _load(two_ranks, "errors")
    assert "shards=1 is not a multiple of the 2 processes" in bad_shards
    assert "already exists" in existing


def test_kfac_curvature_summed_over_two_ranks_equals_one_process(two_ranks):
    two = _load(two_ranks, "kfac")
    model, guide, x, y = ddp_worker.layerwise_setup()
    update = LaplaceEvidenceUpdate(x, y, batch_size=8)
    values, curv = update.compute_curvature(model, guide, step=1)
    one = {b.sites: (b.factors.G, b.factors.A, b.factors.num_data) for b in curv.blocks}
    assert one.keys() == two["blocks"].keys() and len(one) >= 3
    for sites, (g, a, n) in one.items():
        g2, a2, n2 = two["blocks"][sites]
        assert n2 == n == 40
        # float32 minibatch factors, grouped into other minibatches on the ranks: equal to float32 rounding
        torch.testing.assert_close(g2, g, rtol=1e-5, atol=1e-6 * float(g.abs().max()))
        torch.testing.assert_close(a2, a, rtol=1e-5, atol=1e-6 * float(a.abs().max()))
    assert two["log_lik"] == pytest.approx(update.log_likelihood(model, values), rel=1e-6)


def test_laplace_evidence_training_on_two_ranks(two_ranks):
    two, one = _load(two_ranks, "laplace"), ddp_worker.laplace_run(**DDP_ONE_PROCESS)
    assert any(float(v) != 1.0 for v in one["delta"].values())  # δ moved
    for k, v in one["delta"].items():
        torch.testing.assert_close(two["delta"][k], v, rtol=1e-4, atol=1e-6)
    assert two["log_evidence"] == pytest.approx(one["log_evidence"], rel=1e-5)


def test_log_weights_gathered_from_two_ranks(two_ranks, data):
    two = _load(two_ranks, "log_weights")
    res = small_fit(data, steps=3, **DDP_ONE_PROCESS)
    _assert_close_states(fit_state(res), two["state"], rtol=1e-5, atol=1e-6)
    pyro.set_rng_seed(11)
    lw, _ = ranked_log_weights(res.model, res.guide, data.x_train[:64], data.y_train[:64], 7, world=2)
    assert two["lw"].shape == (7,) and len(set(two["lw"].tolist())) == 7  # distinct draws on the two ranks
    torch.testing.assert_close(two["lw"], lw, rtol=1e-5, atol=1e-4)


def test_refusals_without_a_process_group(data, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="start the script with torchrun"):
        small_fit(data, strategy="ddp", shards=2)
    with pytest.raises(ValueError, match="not a multiple of shards=3"):
        FitConfig(batch_size=64, shards=3).validate()
    with pytest.raises(ValueError, match="needs shards=1"):
        FitConfig(shards=2, compile="capture").validate()
    with pytest.raises(ValueError, match="not a multiple of shards=3"):
        small_fit(data, batch_size=None, shards=3)  # 256 rows, full batch

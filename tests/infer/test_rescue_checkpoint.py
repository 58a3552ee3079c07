"""A diverged run names a checkpoint it can be continued from (``docs/reliability.md``: a diverging run
leaves a checkpoint it can continue from).

Block-Cholesky on 8×8 digits at lr 3, 10, 30 and 100 diverges; the checkpoint written just before the
blow-up is finite but doomed (a resume diverges again at the same step, whatever the rate). The
error must name a checkpoint whose resume with a 10× lower ``lr`` trains to the end.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.data.images import load_dataset
from pyro_invariance.infer.checkpoint import load_checkpoint
from pyro_invariance.infer.rescue import RescuePoints

torch.set_num_threads(1)

#: steps per rate: enough for the rate to diverge, few enough that a 10× lower rate trains from the
#: start to the end (from the start, lr 3 diverges here at step 20 and lr 10 at step 7-8, so a run
#: at lr 30 or 100, whose only rescue point is its start, can be rescued only over fewer steps)
STEPS = {3.0: 30, 10.0: 12, 30.0: 16, 100.0: 6}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", train_size=256, test_size=32)


def _fit(data, path, lr, steps, every=1, **kw):
    model = pi.models.get("invariant-mlp", image_shape=(1, 8, 8), hidden=64, num_transforms=4)
    return pi.fit(
        model,
        guides.get("block-cholesky", model),
        data,
        lr=lr,
        steps=steps,
        batch_size=64,
        seed=0,
        progress=False,
        checkpoint_path=path,
        checkpoint_every=every,
        **kw,
    )


@pytest.mark.parametrize("lr", sorted(STEPS))
def test_the_named_checkpoint_trains_on_at_a_tenth_of_the_rate(digits, tmp_path, lr):
    path = tmp_path / "c.pt"
    with pytest.raises(FloatingPointError) as info:
        _fit(digits, path, lr, STEPS[lr])
    message = str(info.value)
    named = re.search(r"checkpoint[^']* '([^']+)' \(step (\d+)", message)  # the one the message offers
    assert named and named.group(1) == str(path), message
    assert load_checkpoint(path)["step"] == int(named.group(2))
    resumed = _fit(digits, path, lr / 10, STEPS[lr], every=None, resume=True, allow_changes=["lr"])
    assert resumed.history["step"][-1] == STEPS[lr]
    assert all(math.isfinite(v) for v in resumed.history["elbo"])
    assert "trains on" in message and f"allow_changes=['lr'], lr={lr / 10:g}" in message  # what was checked
    assert {p.name for p in tmp_path.iterdir()} - {"c.pt.lock"} == {"c.pt"}  # no other file left


def test_a_run_no_kept_state_rescues_says_so_and_keeps_its_checkpoint(digits, tmp_path):
    # lr 100 blows up at step 2; from the start, lr 10 (and every rate 10x lower) blows up at step 7 of 30
    with pytest.raises(FloatingPointError) as info:
        _fit(digits, tmp_path / "c.pt", 100.0, 30)
    message = str(info.value)
    assert re.search(
        r"checkpoint '.*c\.pt' \(step 1\) is kept, but no kept state trains on .* through step 7 "
        r"\(from steps 1 and 0, 10x lower rates diverge again: .*\): start again",
        message,
    ), message
    assert load_checkpoint(tmp_path / "c.pt")["step"] == 1


def test_kept_states_thin_out_with_age():
    points = RescuePoints(enabled=True, keep=5)
    for step in range(0, 41):
        points.add({"step": step, "model": {"w": torch.zeros(2)}})
    steps = [s["step"] for s in points.states]
    assert steps[0] == 0 and steps[-1] == 40 and len(steps) == 5
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert gaps == sorted(gaps, reverse=True), steps  # older states further apart

"""Behaviour: η moves the right way on data with a known symmetry.

Settings are fit()'s defaults with the default InvariantMLP on 8×8 digits (RFF, H=256, S=16,
block-Cholesky guide, 1000 steps). Measured once (seed 0): rotated digits η 0.1 → 3.0 rad;
upright digits η ≈ 0.27; MAP (no Occam factor) η 0.1 → 0.33, i.e. it stalls near its start.
"""

import pytest
import torch

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.data.images import load_dataset

torch.set_num_threads(1)

STEPS = 1000


def _fit(data_name, guide_name, **model_kw):
    data = load_dataset(data_name)
    model = pi.models.get("invariant-mlp", image_shape=(1, 8, 8), eta_init=0.1, **model_kw)
    result = pi.fit(model, guides.get(guide_name, model), data, steps=STEPS, seed=0, progress=False)
    return result, data


@pytest.fixture(scope="module")
def rotated_vi():
    return _fit("rotated-digits", "block-cholesky")


def test_elbo_learns_full_rotation_invariance_on_rotated_digits(rotated_vi):
    result, data = rotated_vi
    eta = result.eta["rot"]
    assert eta > 2.4, f"learned η_rot = {eta:.3f} rad, expected > 2.4 (full invariance is π)"
    metrics = pi.evaluate(result, data, num_samples=8)
    assert metrics["accuracy"] > 0.85


def test_elbo_keeps_eta_small_on_upright_digits():
    result, _ = _fit("digits", "block-cholesky")
    eta = result.eta["rot"]
    assert eta < 1.0, f"η_rot = {eta:.3f} rad on upright digits, expected < 1.0"


def test_map_has_no_occam_factor_and_does_not_learn_the_invariance(rotated_vi):
    # MAP with a hierarchical prior is degenerate (σ_p → 0), so MAP uses a fixed unit prior.
    result, _ = _fit("rotated-digits", "map", prior="fixed")
    eta_map, eta_vi = result.eta["rot"], rotated_vi[0].eta["rot"]
    assert eta_map < 1.0, f"MAP η_rot = {eta_map:.3f}"
    assert eta_vi - eta_map > 1.5

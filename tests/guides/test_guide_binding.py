"""A catalogue guide is tied to the model it was built for (:func:`pyro_invariance.guides.check_guide_for`).

Used with a model of other sizes, another class or other latent sites, ``fit``, ``evaluate``,
``to_inference_data`` and the evidence bounds refuse it in one line before any step (they used to end
at step 1 with ``mat1 and mat2 shapes cannot be multiplied`` and Pyro's trace-shape dump). A fresh
copy of the same model (same class, same latent sites) is accepted.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_invariance as pi
from pyro_invariance.guides import check_guide_for
from pyro_invariance.infer.bounds import elbo_bound, evidence_bounds, iwae_bound, log_weights

GUIDES = pi.guides.names()
SMALL = dict(num_transforms=2)  # a cheap invariant MLP (8×8 images, 10 classes)


def _mlp(hidden: int = 4, **kwargs):
    return pi.models.get("invariant-mlp", hidden=hidden, **SMALL, **kwargs)


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(12, 1, 8, 8, generator=gen), torch.randint(0, 10, (12,), generator=gen)


@pytest.mark.parametrize("name", GUIDES)
def test_fit_refuses_a_guide_built_for_another_size_before_step_1(name, data):
    guide = pi.guides.get(name, _mlp(hidden=4))
    with pytest.raises(ValueError) as info:
        pi.fit(_mlp(hidden=8), guide, data, steps=2, progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert f"guide {name!r} was built for another model (InvariantMLP with hidden=4" in message
    assert "site 'out_weight' shape (10, 4)" in message and "this model has hidden=8" in message
    assert "shape (10, 8)" in message and f"pi.guides.get({name!r}, model)" in message
    assert guide.prototype_trace is None  # refused before the guide was even set up


ENTRY_POINTS = {
    "fit": lambda m, g, x, y: pi.fit(m, g, (x, y), steps=1, progress=False),
    "evaluate": lambda m, g, x, y: pi.evaluate((m, g), (x, y), num_samples=2),
    "to_inference_data": lambda m, g, x, y: pi.to_inference_data((m, g), (x, y), num_samples=2),
    "evidence_bounds": lambda m, g, x, y: evidence_bounds(m, g, x, y, (2,)),
    "elbo_bound": lambda m, g, x, y: elbo_bound(m, g, x, y, num_particles=2),
    "iwae_bound": lambda m, g, x, y: iwae_bound(m, g, x, y, 2),
    "log_weights": lambda m, g, x, y: log_weights(m, g, x, y, 2),
}


@pytest.fixture(scope="module")
def trained(data):
    model = _mlp(hidden=4)
    return model, pi.fit(model, "mean-field", data, steps=1, progress=False).guide


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_trained_guide_is_refused_with_another_model(entry, trained, data):
    _, guide = trained
    with pytest.raises(
        ValueError,
        match=r"^guide 'mean-field' was built for another model \(InvariantMLP with "
        r"hidden=4: site 'out_weight' shape \(10, 4\)\); this model has hidden=8",
    ):
        ENTRY_POINTS[entry](_mlp(hidden=8), guide, *data)


def test_a_guide_is_refused_with_a_model_of_another_class():
    guide = pi.guides.get("block-cholesky", _mlp())
    toy = pi.models.get("rotation-toy-2d")
    x, y = torch.randn(6, 2), torch.randint(0, 2, (6,))
    with pytest.raises(
        ValueError,
        match=r"was built for another model \(InvariantMLP\); this model is a "
        r"RotationToy2D: build the guide for this model with "
        r"pi.guides.get\('block-cholesky', model\)$",
    ):
        pi.fit(toy, guide, (x, y), steps=1, progress=False)


def test_a_guide_is_refused_with_a_model_that_has_another_latent_site(data):
    guide = pi.guides.get("symmetry-conditional", _mlp())
    with pytest.raises(
        ValueError,
        match=r"\(InvariantMLP with symmetry_prior=None: no site 'eta'\); this model "
        r"has symmetry_prior='uniform' and site 'eta' shape \(1,\)",
    ):
        pi.fit(_mlp(symmetry_prior="uniform"), guide, data, steps=1, progress=False)


def test_a_saved_guide_follows_a_copy_of_its_model_but_not_another_size(trained, data):
    model, guide = trained
    buffer = io.BytesIO()
    torch.save(guide, buffer)  # Pyro drops a pickled guide's reference to its model; the guide's record stays
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with pytest.raises(ValueError, match=r"built for another model \(InvariantMLP with hidden=4"):
        pi.fit(_mlp(hidden=8), loaded, data, steps=1, progress=False)
    check_guide_for(copy.deepcopy(model), guide)  # same class, same latent sites: accepted
    result = pi.fit(_mlp(hidden=4), loaded, data, steps=1, progress=False)  # rebuilt with the same arguments
    assert torch.isfinite(torch.tensor(result.final_elbo))


def test_building_a_guide_records_its_model_without_drawing_random_numbers():
    model = _mlp(symmetry_prior="logit-normal")  # a prior without a mean: the one site that is drawn
    before = torch.get_rng_state()
    guide = pi.guides.get("mean-field", model)
    assert torch.equal(before, torch.get_rng_state())
    with pytest.raises(ValueError, match="site 'out_weight' shape"):
        check_guide_for(_mlp(hidden=8, symmetry_prior="logit-normal"), guide)


@pytest.mark.parametrize("name", GUIDES)
def test_every_catalogue_guide_knows_its_name(name):
    assert pi.guides.get(name, _mlp()).catalogue_name == name


def test_guides_that_are_not_catalogue_guides_are_left_alone():
    check_guide_for(_mlp(hidden=8), AutoNormal(_mlp(hidden=4)))  # Pyro's own: not checked
    check_guide_for(_mlp(hidden=8), lambda *args, **kwargs: None)

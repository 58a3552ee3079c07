"""Vectorised ELBO particles (``CatalogueModel.vectorizable_particles``): P particles in one pass.

For every model that declares support, ``Trace_ELBO(num_particles=P, vectorize_particles=True,
max_plate_nesting=1)`` must be the sequential P-particle estimator evaluated in one batched pass:
with identical draws it gives the same loss and the same gradients, to float64 rounding. The draws
are made identical by recording them in the vectorised pass and replaying them, particle by particle,
in the sequential one:

* the guide's reparameterised noise (``torch.distributions.normal._standard_normal``): the
  vectorised guide draws ``(P, 1, *site)`` per site; sequential particle ``p`` gets row ``p``;
* the model's own randomness (symmetry samples ε, flow combination weights): the vectorised model
  draws ``P·S`` rows in one call, particle-major, and sequential particle ``p`` gets rows
  ``p·S … (p+1)·S − 1``.

Every recorded draw must be used exactly once, so the test also shows that each particle gets its
own symmetry samples (the sequential estimator), not one set shared by all particles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pyro
import pytest
import torch
import torch.distributions.normal as torch_normal
from pyro.infer import Predictive, Trace_ELBO, TraceMeanField_ELBO

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.models import invariant_mlp, symmetrised_hnn, toy2d
from pyro_invariance.models.base import CatalogueModel

torch.set_num_threads(1)

P = 4  # particles
ELBOS = (Trace_ELBO, TraceMeanField_ELBO)
SUPPORTED = {"basis-regression", "invariant-mlp", "rotation-toy-2d", "symmetrised-hnn"}


# ------------------------------------------------------------------------------------------------
# record / replay of random draws


class _GuideNoise:
    """Records the guide's standard-normal draws of a vectorised pass (one ``(P, 1, *site)`` tensor
    per site, in site order) and hands them back one particle at a time in a sequential pass."""

    def __init__(self) -> None:
        self.real = torch_normal._standard_normal
        self.recorded: list[torch.Tensor] = []
        self.calls = 0
        self.mode = "record"

    def __call__(self, shape: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
        if self.mode == "record":
            out = self.real(shape, dtype=dtype, device=device)
            assert out.shape[:2] == (P, 1), f"a vectorised guide draw has shape {tuple(out.shape)}"
            self.recorded.append(out)
            return out
        k, p = self.calls % len(self.recorded), self.calls // len(self.recorded)
        self.calls += 1
        row = self.recorded[k][p, 0]
        assert p < P and row.numel() == torch.Size(shape).numel(), (tuple(shape), tuple(row.shape))
        return row.reshape(shape)

    def done(self) -> bool:
        return self.calls == P * len(self.recorded)


DETERMINISTIC = {"deterministic", "grid"}  # sampling modes without random draws


class _Rows:
    """Records the outputs (rows) of a sampling function in the vectorised pass and hands the same
    rows back, in order, to the sequential calls."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn, self.recorded, self.mode, self.pos = fn, [], "record", 0

    def __call__(self, num: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        if set(args) & DETERMINISTIC:  # a grid, the same for every particle: nothing to replay
            return self.fn(num, *args, **kwargs)
        if self.mode == "record":
            out = self.fn(num, *args, **kwargs)
            self.recorded.append(out)
            return out
        pool = torch.cat(self.recorded)
        assert self.pos + num <= pool.shape[0], "the sequential pass asks for more draws than the vectorised one made"
        out = pool[self.pos : self.pos + num]
        self.pos += num
        return out

    def done(self) -> bool:
        return self.pos == sum(r.shape[0] for r in self.recorded)


#: The model's own random draws, per model class: (module, function name).
MODEL_DRAWS = {
    "InvariantMLP": (invariant_mlp, "sample_epsilon"),
    "RotationToy2D": (toy2d, "uniform_epsilon"),
    "SymmetrisedHNN": (symmetrised_hnn, "sample_weights"),
}


@contextlib.contextmanager
def _replayed_draws(model: CatalogueModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Patch the guide's noise and the model's sampler; yields ``replay()``, which switches from
    recording (vectorised pass) to replaying (sequential pass)."""
    noise = _GuideNoise()
    monkeypatch.setattr(torch_normal, "_standard_normal", noise)
    rows = None
    if type(model).__name__ in MODEL_DRAWS:
        module, name = MODEL_DRAWS[type(model).__name__]
        rows = _Rows(getattr(module, name))
        monkeypatch.setattr(module, name, rows)

    def replay() -> None:
        noise.mode = "replay"
        if rows is not None:
            rows.mode = "replay"

    yield replay
    assert noise.done(), "the sequential pass did not use every recorded guide draw"
    if rows is not None:
        assert rows.done(), "the sequential pass did not use every recorded symmetry sample"


# ------------------------------------------------------------------------------------------------
# the models


def _data(name: str, n: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    if name == "basis-regression":
        x = 6 * torch.rand(n, 1, generator=gen, dtype=torch.float64) - 3
        return x, torch.cos(2 * x) + 0.1 * torch.randn(n, 1, generator=gen, dtype=torch.float64)
    if name == "invariant-mlp":
        return torch.rand(n, 1, 6, 6, generator=gen, dtype=torch.float64), torch.randint(0, 3, (n,), generator=gen)
    if name == "rotation-toy-2d":
        return torch.randn(n, 2, generator=gen, dtype=torch.float64), torch.randint(0, 3, (n,), generator=gen)
    x = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    return x, x + 0.1 * torch.randn(n, 2, generator=gen, dtype=torch.float64)


IMLP = dict(image_shape=(1, 6, 6), num_classes=3, hidden=5, num_transforms=3)
TOY = dict(num_classes=3, hidden=6, num_transforms=5)
HNN = dict(hidden=(6, 5), num_transforms=3, euler_steps=3, eta_init_std=0.3)
CASES: dict[str, tuple[str, dict]] = {
    "basis": ("basis-regression", dict(num_features=6)),
    "basis-latent": ("basis-regression", dict(num_features=6, symmetry_prior="uniform")),
    "imlp-det-weights": ("invariant-mlp", dict(IMLP, sampling="deterministic", transform_on="weights")),
    "imlp-stoch-weights": ("invariant-mlp", dict(IMLP, transform_on="weights", symmetry="tx+rot")),
    "imlp-stoch-inputs-relu": (
        "invariant-mlp",
        dict(IMLP, transform_on="inputs", activation="relu", symmetry="rot+sx", prior="learned"),
    ),
    "imlp-latent-auto": ("invariant-mlp", dict(IMLP, symmetry_prior="logit-normal", symmetry="rot+ty")),
    "imlp-latent-det": (
        "invariant-mlp",
        dict(IMLP, symmetry_prior="uniform", sampling="deterministic", transform_on="inputs"),
    ),
    "imlp-none": ("invariant-mlp", dict(IMLP, symmetry="none", prior="fixed")),
    "toy-det": ("rotation-toy-2d", TOY),
    "toy-stoch-latent": ("rotation-toy-2d", dict(TOY, sampling="stochastic", symmetry_prior="uniform")),
    "hnn-quadratic": ("symmetrised-hnn", HNN),
    "hnn-latent-hierarchical": (
        "symmetrised-hnn",
        dict(HNN, symmetry_prior="normal", prior="hierarchical", num_generators=2, sampling="ball"),
    ),
    "hnn-so2-grid": ("symmetrised-hnn", dict(HNN, symmetry="so2", sampling="grid")),
    "hnn-none": ("symmetrised-hnn", dict(HNN, symmetry="none", learn_noise=True)),
    "hnn-neural": (
        "symmetrised-hnn",
        dict(HNN, symmetry="neural", num_generators=2, conserved_hidden=(4,), flow_steps=2, eta_init_std=0.1),
    ),
}


def _build(case: str, guide_name: str = "mean-field") -> tuple[CatalogueModel, Any, torch.Tensor, torch.Tensor]:
    name, kwargs = CASES[case]
    model = pi.MODELS.get(name, **kwargs).double()
    x, y = _data(name)
    guide = guides.get(guide_name, model, **({} if guide_name == "map" else {"init_scale": 0.3}))
    guide(x, y)  # set up its parameters outside the recorded draws
    return model, guide, x, y


def _loss_and_grads(elbo: Any, model: Any, guide: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list]:
    params = [p for p in list(model.parameters()) + list(guide.parameters()) if p.requires_grad]
    loss = elbo.differentiable_loss(model, guide, x, y, num_data=3 * x.shape[0])
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.item(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


# ------------------------------------------------------------------------------------------------


def test_support_is_declared():
    for name in pi.MODELS.names():
        model = pi.MODELS.get(name)
        assert type(model).vectorizable_particles is (name in SUPPORTED), name
    assert CatalogueModel.vectorizable_particles is False


def _assert_vectorised_equals_sequential(
    model, guide, x, y, monkeypatch, rel: float = 1e-10, rtol: float = 1e-8, atol: float = 1e-9
) -> None:
    """Trace_ELBO with P vectorised particles equals P sequential particles given the same draws
    (loss to ``rel``; gradients to ``rtol`` and ``atol`` scaled by 1 + the gradient's size)."""
    with _replayed_draws(model, monkeypatch) as replay:
        loss_v, grads_v = _loss_and_grads(
            Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1), model, guide, x, y
        )
        replay()
        loss_s, grads_s = _loss_and_grads(Trace_ELBO(num_particles=P, max_plate_nesting=1), model, guide, x, y)
    assert loss_v == pytest.approx(loss_s, rel=rel)
    for gv, gs in zip(grads_v, grads_s):
        torch.testing.assert_close(gv, gs, rtol=rtol, atol=atol * (1 + float(gs.abs().max())))


@pytest.mark.parametrize("elbo_cls", ELBOS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", list(CASES))
def test_vectorised_loss_and_gradients_equal_sequential_with_identical_draws(case, elbo_cls, monkeypatch):
    model, guide, x, y = _build(case)
    vectorised = elbo_cls(num_particles=P, vectorize_particles=True, max_plate_nesting=1)
    sequential = elbo_cls(num_particles=P, vectorize_particles=False, max_plate_nesting=1)
    with _replayed_draws(model, monkeypatch) as replay:
        loss_v, grads_v = _loss_and_grads(vectorised, model, guide, x, y)
        replay()
        loss_s, grads_s = _loss_and_grads(sequential, model, guide, x, y)
    assert loss_v == pytest.approx(loss_s, rel=1e-10, abs=1e-9)
    assert any(g.abs().max() > 0 for g in grads_s)
    for gv, gs in zip(grads_v, grads_s):
        torch.testing.assert_close(gv, gs, rtol=1e-8, atol=1e-9 * (1 + float(gs.abs().max())))


@pytest.mark.parametrize("case", ["imlp-stoch-weights", "imlp-stoch-inputs-relu", "imlp-latent-auto"])
def test_invariant_mlp_particle_chunks(case, monkeypatch):
    """More particles than ``particle_chunk_elements`` allows run in chunks (here 3 + 1 particles):
    the same numbers as sequential particles."""
    model, guide, x, y = _build(case)
    model.particle_chunk_elements = {"cpu": 3 * x.shape[0] * model.num_transforms * model.hidden}
    _assert_vectorised_equals_sequential(model, guide, x, y, monkeypatch)


@pytest.mark.parametrize("case", ["imlp-stoch-weights", "toy-det", "hnn-quadratic"])
def test_point_estimate_guide_vectorises(case, monkeypatch):
    """``map`` (AutoDelta) has no noise: the two estimators agree given the model's draws alone."""
    model, guide, x, y = _build(case, "map")
    _assert_vectorised_equals_sequential(model, guide, x, y, monkeypatch)


@pytest.mark.parametrize("case", ["imlp-stoch-weights", "toy-stoch-latent", "hnn-latent-hierarchical"])
def test_particles_get_their_own_symmetry_samples(case):
    """Under vectorised particles the model draws P·S symmetry samples (P sets), not one shared set:
    two particles with the same weights still give different predictions."""
    model, guide, x, y = _build(case)
    pyro.set_rng_seed(1)
    with pyro.plate("particles", P, dim=-2), torch.no_grad():
        tr = pyro.poutine.trace(guide).get_trace(x, y)
        same = {k: v["value"][:1].expand_as(v["value"]) for k, v in tr.nodes.items() if v["type"] == "sample"}
        out = pyro.poutine.condition(model, data=same)(x, y)
    assert out.shape[0] == P and out.shape[1] == x.shape[0]
    assert not torch.allclose(out[0], out[1])


@pytest.mark.parametrize("case", ["basis-latent", "imlp-latent-auto", "toy-stoch-latent", "hnn-latent-hierarchical"])
def test_prior_predictive_parallel_shapes(case):
    """``Predictive(parallel=True)`` runs the model under a particle plate too (prior draws here:
    Pyro's parallel ``Predictive`` with a guide drops the data plate's 1 from sites whose event dims
    reach it, a Pyro limitation for matrix-valued sites)."""
    model, _, x, _ = _build(case)
    par = Predictive(model, num_samples=3, parallel=True, return_sites=["obs", "_RETURN"])(x)
    seq = Predictive(model, num_samples=3, return_sites=["obs", "_RETURN"])(x)
    assert par["obs"].shape == seq["obs"].shape
    assert par["_RETURN"].shape == seq["_RETURN"].shape


def test_float32_vectorised_close_to_sequential(monkeypatch):
    name, kwargs = CASES["hnn-quadratic"]
    model = pi.MODELS.get(name, **kwargs)
    x, y = (t.float() for t in _data(name))
    guide = guides.get("mean-field", model, init_scale=0.3)
    guide(x, y)
    with _replayed_draws(model, monkeypatch) as replay:
        loss_v, _ = _loss_and_grads(
            Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1), model, guide, x, y
        )
        replay()
        loss_s, _ = _loss_and_grads(Trace_ELBO(num_particles=P, max_plate_nesting=1), model, guide, x, y)
    assert loss_v == pytest.approx(loss_s, rel=1e-5)


@pytest.mark.parametrize("case", ["basis-latent", "imlp-latent-auto", "hnn-latent-hierarchical"])
def test_symmetry_conditional_guide_vectorises(case, monkeypatch):
    """``q(η) q(θ | η)`` (AutoStructured) under vectorised particles: θ's draw depends on its own
    particle's η. float32 (the guide builds its dependency matrix in the default dtype)."""
    name, kwargs = CASES[case]
    model = pi.MODELS.get(name, **kwargs)
    x, y = (t.float() if t.is_floating_point() else t for t in _data(name))
    guide = guides.get("symmetry-conditional", model, init_scale=0.3)
    guide(x, y)
    deps = [p for pname, p in guide.named_parameters() if pname.startswith("deps.")]
    assert deps
    with torch.no_grad():  # a non-zero dependency B, so that q(θ | η) does depend on η
        for p in deps:
            p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))
    _assert_vectorised_equals_sequential(model, guide, x, y, monkeypatch, rel=1e-5, rtol=1e-4, atol=1e-5)

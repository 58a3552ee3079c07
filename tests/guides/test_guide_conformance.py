"""Every registered guide (but ``map``) × {``Trace_ELBO`` and ``TraceMeanField_ELBO`` in a plain
``pyro.infer.SVI`` loop, ``pi.fit``} × {a user-written 2-layer BNN, each catalogue family}: every
combination runs and gives a finite bound estimate, or refuses in one line; where the exact log evidence
is known (basis regression) the estimate stays below it. The tight checks against a known log Z on
user-written models are in ``test_bound_validity.py`` (plain SVI) and ``test_user_models.py``
(``pi.fit``). Sizes are tiny: a few steps each.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.nn import PyroModule, PyroSample
from test_catalogue_contract import DATA_KWARGS, EXAMPLES

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.catalogue import model_kwargs_for
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.infer.bounds import evidence_bounds

pytestmark = pytest.mark.plain_pyro  # Pyro's defaults, as a user's session has them (tests/conftest.py)

BOUND_GUIDES = [name for name in guides.names() if name != "map"]
FAMILIES = ["user-bnn", "basis-regression", "invariant-mlp", "rotation-toy-2d", "symmetrised-hnn", "layerwise-conv"]
MODES = ["Trace_ELBO", "TraceMeanField_ELBO", "pi.fit"]
STEPS, EVALUATIONS = 3, 20


class TwoLayerBNN(PyroModule):
    """A 1 → 8 → 1 tanh network with ``PyroSample`` weights, as Pyro's tutorials write a BNN."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.fc1 = PyroModule[torch.nn.Linear](1, hidden)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([hidden, 1]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](hidden, 1)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, hidden]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        mean = self.fc2(torch.tanh(self.fc1(x))).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Normal(mean, 0.1), obs=y)


def _family(name: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A fresh model and its (converted, checked) training pair."""
    if name == "user-bnn":
        g = torch.Generator().manual_seed(0)
        x = torch.linspace(-3, 3, 24).unsqueeze(-1)
        return TwoLayerBNN(), x, torch.sin(x.squeeze(-1)) + 0.1 * torch.randn(24, generator=g)
    data_name, kwargs = EXAMPLES[name]
    data = pi.DATASETS.get(data_name, train_size=16, test_size=8, **DATA_KWARGS.get(data_name, {}))
    model = pi.MODELS.get(name, **model_kwargs_for(name, data, **kwargs))
    return (model, *train_arrays(data, model))


def _one_line_refusal(exc: BaseException) -> bool:
    return isinstance(exc, (ValueError, TypeError, NotImplementedError)) and "\n" not in str(exc).strip()


def _plain_svi(model, guide, elbo_cls, x, y) -> tuple[float, float]:
    elbo = elbo_cls()
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), elbo)
    for _ in range(STEPS):
        svi.step(x, y)
    values = torch.tensor([-elbo.loss(model, guide, x, y) for _ in range(EVALUATIONS)])
    return float(values.mean()), float(values.std() / math.sqrt(EVALUATIONS))


def _pi_fit(model, guide, x, y) -> tuple[float, float]:
    pi.fit(model, guide, (x, y), steps=STEPS, batch_size=None, progress=False)
    elbo = evidence_bounds(model, guide, x, y, Ks=(10,), num_samples=EVALUATIONS).elbo
    return elbo.value, elbo.stderr


def _cases() -> list:
    """Every combination; the dense 4078×4078 factor of full-rank on the layer-wise network takes ~10 s
    a step here, so those three run with the slow tests."""
    slow = ("layerwise-conv", "full-rank")
    return [
        pytest.param(f, g, m, marks=[pytest.mark.slow] if (f, g) == slow else [])
        for f in FAMILIES
        for g in BOUND_GUIDES
        for m in MODES
    ]


@pytest.mark.filterwarnings("ignore:.*log weights are too few for PSIS")  # 20 draws: enough for a finite estimate
@pytest.mark.parametrize(("family", "guide_name", "mode"), _cases())
def test_every_guide_runs_or_refuses_in_one_line(family, guide_name, mode):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model, x, y = _family(family)
    try:
        guide = guides.get(guide_name, model)
        if mode == "pi.fit":
            estimate, se = _pi_fit(model, guide, x, y)
        else:
            estimate, se = _plain_svi(
                model, guide, {"Trace_ELBO": Trace_ELBO, "TraceMeanField_ELBO": TraceMeanField_ELBO}[mode], x, y
            )
    except Exception as exc:  # noqa: BLE001 - a refusal must be one line; anything else fails below
        assert _one_line_refusal(exc), f"{type(exc).__name__}: {exc}"
        return
    finally:
        pyro.clear_param_store()
    assert math.isfinite(estimate), (family, guide_name, mode, estimate)
    if family == "basis-regression":  # the exact evidence at the model's current η
        log_z = float(model.log_evidence(x, y).detach())
        assert estimate <= log_z + 3 * se, (estimate - log_z, se)


def test_full_rank_refuses_a_factor_too_large_for_memory_before_allocating_it():
    """The three-pathway layer-wise network on 8×8 digits has 131 260 latent dimensions: a dense factor
    of 64 GiB, which the guide used to try to allocate at its first call."""
    data = pi.DATASETS.get("rotated-digits", train_size=16, test_size=8)
    model = pi.MODELS.get("layerwise-fc+conv+gconv", **model_kwargs_for("layerwise-fc+conv+gconv", data, alpha=1))
    with pytest.raises(ValueError) as err:
        guides.get("full-rank", model)
    text = str(err.value)
    assert "\n" not in text and "131260×131260" in text and "'low-rank' or 'block-cholesky'" in text

"""Tests of pyro_invariance.diagnostics.layerwise_analysis: δ, γ = P − δ·tr Σ_q, shares, table and figure."""

from __future__ import annotations

import math
from operator import attrgetter

import matplotlib.pyplot as plt
import pyro
import pytest
import torch
from pyro import poutine

from pyro_invariance import guides
from pyro_invariance.diagnostics.layerwise_analysis import analyse_pathways, block_shares, pathway_table, plot_pathways
from pyro_invariance.models.layerwise import LayerwiseNet

torch.set_num_threads(1)


def _net(variant: str = "fc+conv", **kw) -> LayerwiseNet:
    return LayerwiseNet(variant=variant, image_shape=(1, 8, 8), num_classes=4, alpha=1, **kw)


def _init(guide, x):
    with poutine.block(), torch.no_grad():
        guide(x, torch.zeros(x.shape[0], dtype=torch.long), num_data=10)


def test_gamma_is_p_minus_delta_trace_for_a_mean_field_guide():
    pyro.set_rng_seed(0)
    model = _net()
    x = torch.rand(2, 1, 8, 8)
    guide = guides.get("mean-field", model, init_scale=0.5)
    _init(guide, x)
    reports = analyse_pathways(model, guide)
    shapes = model.site_shapes()
    assert [r.block for r in reports][-2:] == [8, 9] and reports[-1].kind == "head"
    for r, p in zip(reports, model.pathways()):
        assert r.num_params == sum(math.prod(shapes[s]) for s in p.sites)
        # every variance is 0.5² and δ = 1 at initialisation: γ = P − 0.25·P
        assert r.precision == pytest.approx([1.0] * len(p.sites))
        assert r.trace_cov == pytest.approx([0.25 * math.prod(shapes[s]) for s in p.sites], rel=1e-5)
        assert r.gamma == pytest.approx(0.75 * r.num_params, rel=1e-5)
    for block, shares in block_shares(reports).items():
        assert sum(shares.values()) == pytest.approx(1.0)
        assert set(shares) == {"fc", "conv"}


def test_precision_scales_gamma_and_switches_a_pathway_off():
    model = _net()
    x = torch.rand(2, 1, 8, 8)
    guide = guides.get("mean-field", model, init_scale=1.0)
    _init(guide, x)
    # make block 2's FC pathway "off": δ large, posterior at the prior (tr Σ = P/δ) -> γ = 0
    module = model.blocks[2].pathway("fc")
    setattr(module, type(module).weights["weight"], torch.tensor(1e6))
    parent = attrgetter("blocks.2.fc")(guide.scales)
    parent.weight = torch.full_like(parent.weight, 1e-3)
    conv = attrgetter("blocks.2.conv")(guide.scales)
    conv.weight = torch.full_like(conv.weight, 0.5)  # γ/P = 0.75 for the CONV pathway
    reports = {(r.block, r.kind): r for r in analyse_pathways(model, guide)}
    off = reports[(2, "fc")]
    assert off.precision[0] == pytest.approx(1e6, rel=1e-4)
    assert abs(off.gamma) < 1e-3 * off.num_params
    assert reports[(2, "conv")].share == pytest.approx(1.0, abs=1e-3)
    assert reports[(2, "fc")].share == pytest.approx(0.0, abs=1e-3)


def test_map_guide_and_monte_carlo_trace():
    model = _net("conv", prior="fixed")
    x = torch.rand(2, 1, 8, 8)
    delta = guides.get("map", model)
    _init(delta, x)
    assert all(r.gamma == r.num_params for r in analyse_pathways(model, delta))
    pyro.set_rng_seed(1)
    mean_field = guides.get("mean-field", model, init_scale=0.3)
    _init(mean_field, x)
    exact = analyse_pathways(model, mean_field)

    def no_site_distributions(name):  # like the packed full-rank / low-rank autoguides
        raise NotImplementedError

    mean_field.get_distribution = no_site_distributions
    estimated = analyse_pathways(model, mean_field, x=x, num_samples=400)
    for e, r in zip(exact, estimated):  # tr Σ = 0.09·P, estimated from 400 draws
        assert e.trace_cov[0] == pytest.approx(0.09 * e.num_params, rel=1e-5)
        assert r.trace_cov[0] == pytest.approx(e.trace_cov[0], rel=0.15)
    with pytest.raises(ValueError, match="pass x"):
        analyse_pathways(model, mean_field)


def test_table_plot_and_bad_model():
    model = _net("f-fc+conv")
    x = torch.rand(2, 1, 8, 8)
    guide = guides.get("matrix-normal", model)
    _init(guide, x)
    reports = analyse_pathways(model, guide)
    assert any(len(r.precision) == 2 for r in reports if r.kind == "ffc")
    table = pathway_table(reports)
    assert table.count("\n") == len(reports) + 1 and "F-FC" in table and "CONV" in table
    fig = plot_pathways(reports, title="test")
    assert len(fig.axes) == 2 and fig.axes[0].patches and fig.axes[1].get_lines()
    plt.close(fig)
    with pytest.raises(TypeError, match="not a layer-wise network"):
        analyse_pathways(torch.nn.Linear(2, 2), guide)

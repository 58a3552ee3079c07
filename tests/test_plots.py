"""Tests of ``pyro_invariance.diagnostics.plots``: each function writes its PNG, and the figure has the panels,
lines and images it should (captured before the figure is closed)."""

from __future__ import annotations

import math

import torch

torch.set_num_threads(1)

import matplotlib  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pyro_invariance.diagnostics import plots  # noqa: E402
from pyro_invariance.symmetry.conserved import oracle_generators  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved by ``plots`` during the test: a list of dicts describing it."""
    seen = []
    real_save = plots._save

    def save(fig, path):
        axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison or ax.images]
        seen.append({
            "axes": fig.axes,
            "titles": [ax.get_title() for ax in fig.axes],
            "lines": [len(ax.get_lines()) for ax in fig.axes],
            "images": sum(len(ax.images) for ax in fig.axes),
            "visible": len(axes),
            "suptitle": fig._suptitle.get_text() if fig._suptitle else "",
            "yscale": [ax.get_yscale() for ax in fig.axes],
            "ylabels": [ax.get_ylabel() for ax in fig.axes],
            "ydata": [[line.get_ydata() for line in ax.get_lines()] for ax in fig.axes],
        })  # fmt: skip
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", save)
    return seen


def _history(eta: dict[str, list[float]], steps: int = 30):
    return {"step": list(range(1, steps + 1)), "elbo": list(np.linspace(-2, -1, steps)), "eta": eta}


def test_eta_history_human_units_and_data_range(tmp_path, figures):
    steps = 30
    rot = list(np.linspace(0.1, 3.0, steps))
    hist = _history({"rot": rot, "tx": [0.2] * steps, "sx": [math.log(2)] * steps})
    path = plots.plot_eta_history({"learned": hist}, tmp_path / "eta.png", "t",
                                  data_range={"rot": math.pi, "tx": 0.5}, image_size=8)
    assert path.exists() and path.stat().st_size > 0
    fig = figures[-1]
    assert fig["titles"] == ["rotation", "translation", "scale", "bound"]
    # rotation: η line in degrees, the data's range (dashed) and the 180° line
    assert fig["lines"][0] == 3
    np.testing.assert_allclose(fig["ydata"][0][0], np.degrees(rot))
    assert fig["ydata"][0][1][0] == pytest.approx(180.0)
    # translation in pixels: η (size − 1)/2, data range 0.5 → 1.75 px
    assert fig["ylabels"][1] == "η (pixels)" and fig["ydata"][1][0][0] == pytest.approx(0.2 * 3.5)
    assert fig["ydata"][1][1][0] == pytest.approx(1.75)
    assert fig["ydata"][2][0][0] == pytest.approx(2.0)  # scale factor e^η
    assert fig["lines"][3] == 1  # ELBO


def test_eta_history_from_a_dataset_several_runs_and_other_parameters(tmp_path, figures):
    from pyro_invariance.data.images import load_dataset

    data = load_dataset("scaled-digits", train_size=10, test_size=10)
    assert plots.data_eta_range(data) == {"sx": pytest.approx(math.log(2)), "sy": pytest.approx(math.log(2))}
    assert plots.data_eta_range(load_dataset("digits", train_size=10, test_size=10)) == {}
    runs = {
        "a": _history({"sx": [0.1] * 30, "sy": [0.2] * 30}),
        "b": _history({"delta.0": list(np.geomspace(1, 1e4, 30))}),
        "c": _history({}),
    }
    plots.plot_eta_history(runs, tmp_path / "runs.png", data_range=data)
    fig = figures[-1]
    assert fig["titles"] == ["scale", "other symmetry parameters", "bound"]
    assert fig["lines"][0] == 4  # two η lines, each with the data's ln 2 (as factor 2)
    assert fig["ydata"][0][1][0] == pytest.approx(2.0)
    assert fig["yscale"][1] == "log" and fig["lines"][2] == 3


def test_eta_history_without_symmetry_parameters(tmp_path, figures):
    plots.plot_eta_history({"plain": _history({})}, tmp_path / "plain.png")
    assert figures[-1]["titles"] == ["bound"]


def test_filter_banks_conv_and_fc(tmp_path, figures):
    gen = torch.Generator().manual_seed(0)
    sites = {
        "blocks.0.conv.weight": torch.randn(5, 2 * 9, generator=gen),  # (C_out, C_in·9)
        "blocks.0.fc.weight": torch.randn(5 * 36, 2 * 36, generator=gen),  # (C_out·H·W, C_in·H·W)
        "blocks.1.conv.weight": torch.randn(3, 5 * 9, generator=gen).numpy(),
    }
    path = plots.plot_filter_banks(sites, tmp_path / "f.png", image_shape=(2, 6, 6), max_units=4)
    assert path.exists()
    fig = figures[-1]
    assert fig["images"] == 5 + 4
    assert fig["titles"][:2] == ["conv 0", "conv 1"] and "fc unit (0,0)" in fig["titles"]
    plots.plot_filter_banks(sites, tmp_path / "b1.png", block=1, max_filters=2)
    assert figures[-1]["images"] == 2 and figures[-1]["suptitle"] == "block 1 filters"
    with pytest.raises(ValueError, match="blocks.2.conv.weight"):
        plots.plot_filter_banks(sites, tmp_path / "x.png", block=2)
    with pytest.raises(ValueError, match="expected"):
        plots.plot_filter_banks({"blocks.0.conv.weight": torch.zeros(4, 10)}, tmp_path / "x.png")


def test_filter_banks_of_a_layerwise_model_guide_median(tmp_path, figures):
    """The real site layout: a tiny layerwise-fc+conv model and its guide's median."""
    import pyro_invariance as pi
    from pyro_invariance import guides

    if "layerwise-fc+conv" not in pi.MODELS.names():
        pytest.skip("layerwise models are not registered")
    model = pi.models.get("layerwise-fc+conv", image_shape=(1, 8, 8), alpha=2)
    guide = guides.get("mean-field", model)
    x = torch.rand(3, 1, 8, 8)
    guide(x, torch.zeros(3, dtype=torch.long))
    plots.plot_filter_banks(guide.median(), tmp_path / "lw.png", image_shape=(1, 8, 8), max_units=3)
    assert figures[-1]["images"] == 2 + 3  # α = 2 conv filters, 3 FC units


def test_generators_vector_field_and_orbit(tmp_path, figures):
    image = torch.zeros(8, 8)
    image[2:6, 3] = 1.0
    path = plots.plot_generators({"rot": math.pi / 2, "tx": 0.3}, tmp_path / "g.png", image=image, num_examples=4)
    assert path.exists()
    fig = figures[-1]
    assert len(fig["axes"]) == 5 and fig["images"] == 4
    assert fig["titles"][1] == "ε = -1.00" and "rot ±90.0°" in fig["suptitle"]
    quiver = fig["axes"][0].collections[0]
    assert quiver.U.size == 13 * 13
    plots.plot_generators({"rot": 1.0}, tmp_path / "g1.png")
    assert len(figures[-1]["axes"]) == 1
    with pytest.raises(ValueError, match="unknown generators"):
        plots.plot_generators({"lambda": 1.0}, tmp_path / "x.png")


def test_conserved_quantities(tmp_path, figures):
    g = oracle_generators("so2", 2)  # the SHO's energy: C = (q² + p²)
    path = plots.plot_conserved_quantities(g, tmp_path / "c.png", titles=["SO(2)"])
    assert path.exists()
    fig = figures[-1]
    assert fig["titles"] == ["SO(2)"] and fig["suptitle"].startswith("conserved quantities on the (q0, p0)")
    ax = fig["axes"][0]
    assert len(ax.collections) >= 2  # contour set + quiver
    u3 = oracle_generators("un", 6)  # 9 generators on 3 oscillators: first 6 panels
    plots.plot_conserved_quantities(u3, tmp_path / "u3.png", dims=(0, 3))
    assert len(figures[-1]["axes"]) == 6 and figures[-1]["titles"][0] == "C_0"
    with pytest.raises(ValueError, match="dims"):
        plots.plot_conserved_quantities(g, tmp_path / "x.png", dims=(0, 0))
    with pytest.raises(ValueError, match="K >= 1"):
        plots.plot_conserved_quantities(torch.zeros(0, 3, 3), tmp_path / "x.png")


def test_conserved_quantities_of_a_model(tmp_path, figures):
    import pyro_invariance as pi

    model = pi.models.get("symmetrised-hnn", state_dim=2, hidden=(8, 8), num_samples=2, euler_steps=1,
                          symmetry="learned")
    plots.plot_conserved_quantities(model, tmp_path / "m.png")
    assert len(figures[-1]["axes"]) == model.num_generators


def test_existing_plots_still_work(tmp_path):
    import pyro_invariance as pi

    model = pi.models.get("invariant-mlp", image_shape=(1, 8, 8), hidden=8, num_samples=2)
    assert plots.plot_filter_bank(model, tmp_path / "fb.png", rows=(0, 1), num=3).exists()
    assert matplotlib.get_backend().lower() == "agg"

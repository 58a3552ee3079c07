"""Tests of the package's plots: each ``plot_*`` function draws into the figure (or axes) it is given,
or a new one, and returns it (matplotlib's convention); the figures have the panels, lines and images
they should; the orbit plot shows the learned transforms; nothing in the package selects a backend."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.diagnostics import plots  # noqa: E402
from pyro_invariance.symmetry.conserved import oracle_generators  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = [REPO / "pyro_invariance", REPO / "models", REPO / "guides"]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _info(fig: Figure) -> dict[str, Any]:
    """What a figure shows, for the assertions below."""
    assert isinstance(fig, Figure)
    return {
        "axes": fig.axes,
        "titles": [ax.get_title() for ax in fig.axes],
        "lines": [len(ax.get_lines()) for ax in fig.axes],
        "images": sum(len(ax.images) for ax in fig.axes),
        "suptitle": fig._suptitle.get_text() if fig._suptitle else "",
        "yscale": [ax.get_yscale() for ax in fig.axes],
        "ylabels": [ax.get_ylabel() for ax in fig.axes],
        "ydata": [[line.get_ydata() for line in ax.get_lines()] for ax in fig.axes],
    }


def _history(eta: dict[str, list[float]], steps: int = 30):
    return {"step": list(range(1, steps + 1)), "elbo": list(np.linspace(-2, -1, steps)), "eta": eta}


def test_eta_history_human_units_and_data_range(tmp_path):
    steps = 30
    rot = list(np.linspace(0.1, 3.0, steps))
    hist = _history({"rot": rot, "tx": [0.2] * steps, "sx": [math.log(2)] * steps})
    figure = plots.plot_eta_history({"learned": hist}, title="t", data_range={"rot": math.pi, "tx": 0.5}, image_size=8)
    path = plots.save_figure(figure, tmp_path / "sub" / "eta.png")
    assert path.stat().st_size > 0 and not plt.fignum_exists(figure.number)  # saved and closed
    fig = _info(figure)
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


def test_eta_history_from_a_dataset_several_runs_and_other_parameters():
    from pyro_invariance.data.images import load_dataset

    data = load_dataset("scaled-digits", train_size=10, test_size=10)
    assert plots.data_eta_range(data) == {"sx": pytest.approx(math.log(2)), "sy": pytest.approx(math.log(2))}
    assert plots.data_eta_range(load_dataset("digits", train_size=10, test_size=10)) == {}
    runs = {
        "a": _history({"sx": [0.1] * 30, "sy": [0.2] * 30}),
        "b": _history({"delta.0": list(np.geomspace(1, 1e4, 30))}),
        "c": _history({}),
    }
    fig = _info(plots.plot_eta_history(runs, data_range=data))
    assert fig["titles"] == ["scale", "other symmetry parameters", "bound"]
    assert fig["lines"][0] == 4  # two η lines, each with the data's ln 2 (as factor 2)
    assert fig["ydata"][0][1][0] == pytest.approx(2.0)
    assert fig["yscale"][1] == "log" and fig["lines"][2] == 3


def test_eta_history_without_symmetry_parameters():
    assert _info(plots.plot_eta_history({"plain": _history({})}))["titles"] == ["bound"]


def test_filter_banks_conv_and_fc():
    gen = torch.Generator().manual_seed(0)
    sites = {
        "blocks.0.conv.weight": torch.randn(5, 2 * 9, generator=gen),  # (C_out, C_in·9)
        "blocks.0.fc.weight": torch.randn(5 * 36, 2 * 36, generator=gen),  # (C_out·H·W, C_in·H·W)
        "blocks.1.conv.weight": torch.randn(3, 5 * 9, generator=gen).numpy(),
    }
    fig = _info(plots.plot_filter_banks(sites, image_shape=(2, 6, 6), max_units=4))
    assert fig["images"] == 5 + 4
    assert fig["titles"][:2] == ["conv 0", "conv 1"] and "fc unit (0,0)" in fig["titles"]
    fig = _info(plots.plot_filter_banks(sites, block=1, max_filters=2))
    assert fig["images"] == 2 and fig["suptitle"] == "block 1 filters"
    with pytest.raises(ValueError, match="blocks.2.conv.weight"):
        plots.plot_filter_banks(sites, block=2)
    with pytest.raises(ValueError, match="expected"):
        plots.plot_filter_banks({"blocks.0.conv.weight": torch.zeros(4, 10)})


def test_filter_banks_of_a_layerwise_model_guide_median():
    """The real site layout: a tiny layerwise-fc+conv model and its guide's median."""
    from pyro_invariance import guides

    model = pi.models.get("layerwise-fc+conv", image_shape=(1, 8, 8), alpha=2)
    guide = guides.get("mean-field", model)
    x = torch.rand(3, 1, 8, 8)
    guide(x, torch.zeros(3, dtype=torch.long))
    fig = plots.plot_filter_banks(guide.median(), image_shape=(1, 8, 8), max_units=3)
    assert _info(fig)["images"] == 2 + 3  # α = 2 conv filters, 3 FC units


def test_generators_vector_field_and_orbit():
    image = torch.zeros(8, 8)
    image[2:6, 3] = 1.0
    fig = _info(plots.plot_generators({"rot": math.pi / 2, "tx": 0.3}, image=image, num_examples=4))
    assert len(fig["axes"]) == 5 and fig["images"] == 4
    assert fig["titles"][1] == "ε = -1.00" and "rot ±90.0°" in fig["suptitle"]
    quiver = fig["axes"][0].collections[0]
    assert quiver.U.size == 13 * 13
    assert len(plots.plot_generators({"rot": 1.0}).axes) == 1
    with pytest.raises(ValueError, match="unknown generators"):
        plots.plot_generators({"lambda": 1.0})


def test_conserved_quantities():
    g = oracle_generators("so2", 2)  # the SHO's energy: C = (q² + p²)
    fig = _info(plots.plot_conserved_quantities(g, titles=["SO(2)"]))
    assert fig["titles"] == ["SO(2)"] and fig["suptitle"].startswith("conserved quantities on the (q0, p0)")
    ax = fig["axes"][0]
    assert len(ax.collections) >= 2  # contour set + quiver
    u3 = oracle_generators("un", 6)  # 9 generators on 3 oscillators: first 6 panels
    fig = _info(plots.plot_conserved_quantities(u3, dims=(0, 3)))
    assert len(fig["axes"]) == 6 and fig["titles"][0] == "C_0"
    with pytest.raises(ValueError, match="dims"):
        plots.plot_conserved_quantities(g, dims=(0, 0))
    with pytest.raises(ValueError, match="K >= 1"):
        plots.plot_conserved_quantities(torch.zeros(0, 3, 3))


def test_conserved_quantities_of_a_model():
    model = pi.models.get(
        "symmetrised-hnn", state_dim=2, hidden=(8, 8), num_transforms=2, euler_steps=1, symmetry="quadratic"
    )
    assert len(plots.plot_conserved_quantities(model).axes) == model.num_generators


def test_filter_bank():
    model = pi.models.get("invariant-mlp", image_shape=(1, 8, 8), hidden=8, num_transforms=2)
    fig = _info(plots.plot_filter_bank(model, rows=(0, 1), num=3))
    assert len(fig["axes"]) == 2 * 3 and fig["images"] == 6 and fig["suptitle"].startswith("filter bank")


# -------------------------------------------------------------------------------------------------
# the orbit plot of an InvariantMLP


def _invariant_mlp(activation: str, eta: float, symmetry: str = "rotation") -> Any:
    return pi.models.get(
        "invariant-mlp",
        image_shape=(1, 8, 8),
        hidden=6,
        num_transforms=2,
        activation=activation,
        symmetry=symmetry,
        learn_symmetry=False,
        eta_init=eta,
    )


def _panels(fig: Figure, steps: int) -> np.ndarray:
    """The images shown, ``(rows, steps, H, W)``."""
    shown = np.stack([np.asarray(ax.images[0].get_array()) for ax in fig.axes])
    return shown.reshape(-1, steps, *shown.shape[1:])


def test_orbits_at_eta_zero_are_the_identity():
    steps = 5
    fig = plots.plot_orbits(_invariant_mlp("relu", 0.0), num=3, steps=steps)  # first-layer filters
    panels = _panels(fig, steps)
    assert panels.shape == (3, steps, 8, 8)
    for j in range(steps):
        np.testing.assert_allclose(panels[:, j], panels[:, steps // 2], atol=1e-5)
    assert [ax.get_title() for ax in fig.axes[:steps]] == [
        "ε = -1.00",
        "ε = -0.50",
        "ε = +0.00",
        "ε = +0.50",
        "ε = +1.00",
    ]
    assert fig.axes[0].get_ylabel() == "filter 0" and "rot ±0.0°" in fig._suptitle.get_text()


def test_orbits_at_eta_above_zero_move_the_images_and_keep_the_middle_column():
    steps = 5
    model = _invariant_mlp("rff", math.pi / 2)
    x = torch.zeros(2, 1, 8, 8)
    x[:, 0, 1:7, 3:5] = 1.0  # a vertical bar through the centre: ±90° turn it into the same horizontal bar
    fig = plots.plot_orbits(model, x.numpy(), steps=steps)  # arrays work as well as tensors
    panels = _panels(fig, steps)
    assert panels.shape == (2, steps, 8, 8)  # num = 5, but only two images
    np.testing.assert_allclose(panels[:, steps // 2], x[:, 0].numpy(), atol=1e-5)  # ε = 0: the image itself
    for j in (0, 1, 3, 4):
        assert np.abs(panels[:, j] - panels[:, steps // 2]).max() > 0.1
    np.testing.assert_allclose(panels[0, 0], x[0, 0].T.numpy(), atol=1e-5)  # η = π/2: ε = ±1 is ±90°
    np.testing.assert_allclose(panels[0, -1], x[0, 0].T.numpy(), atol=1e-5)
    assert fig.axes[0].get_ylabel() == "image 0" and "fixed η: rot ±90.0°" in fig._suptitle.get_text()
    # flattened rows, and the same orbit as the model's own warp of its inputs
    flat = plots.plot_orbits(model, x.reshape(2, -1), num=1, steps=steps)
    np.testing.assert_allclose(_panels(flat, steps)[0], panels[0], atol=1e-6)


def test_orbits_of_every_generator_and_bad_inputs():
    model = _invariant_mlp("relu", 0.2, symmetry="affine")
    fig = plots.plot_orbits(model, num=2, steps=3)
    assert len(fig.axes) == 6 and "shear" in fig._suptitle.get_text()
    plain = plots.plot_orbits(_invariant_mlp("relu", 0.0, symmetry="none"), steps=2)
    assert "no symmetry" in plain._suptitle.get_text()
    with pytest.raises(ValueError, match="RFF"):
        plots.plot_orbits(_invariant_mlp("rff", 1.0))
    with pytest.raises(ValueError, match="x must have shape"):
        plots.plot_orbits(model, torch.zeros(2, 1, 6, 6))
    with pytest.raises(ValueError, match="x must have shape"):
        plots.plot_orbits(model, torch.zeros(0, 1, 8, 8))
    with pytest.raises(ValueError, match="at least 1"):
        plots.plot_orbits(model, steps=0)


# -------------------------------------------------------------------------------------------------
# every plot function: fig= / ax= in, the Figure out; no backend switching


def _layerwise_reports() -> list:
    from pyro_invariance.diagnostics.layerwise_analysis import PathwayReport

    return [
        PathwayReport(0, "fc", 100, [2.0], [1.0], 10.0, 0.1, 0.4),
        PathwayReport(0, "conv", 10, [0.5], [1.0], 6.0, 0.6, 0.6),
        PathwayReport(8, "head", 20, [1.0], [1.0], 5.0, 0.25),
    ]


def _comparison() -> Any:
    from pyro_invariance.diagnostics.compare import GuideComparison

    nan = float("nan")
    rows = [
        {
            "guide": "mean-field",
            "elbo": -1.2,
            "elbo_se": 0.01,
            "iwae10": -1.1,
            "iwae10_se": 0.01,
            "k_hat": 0.5,
            "is_bound": True,
            "log_evidence": -1.0,
            "metrics": {},
        },
        {
            "guide": "map",
            "elbo": -0.9,
            "elbo_se": nan,
            "iwae10": nan,
            "iwae10_se": nan,
            "k_hat": nan,
            "is_bound": False,
            "metrics": {},
        },
    ]
    return GuideComparison(rows, {"n_eval": 10, "model": "m", "data": "d"}, "regression", (10,))


def _idata() -> Any:
    from pyro_invariance.diagnostics import arviz_compat

    draws = np.random.default_rng(0).normal(size=(1, 20))
    return arviz_compat.from_arrays({"posterior": {"mu": draws}})


def _cases() -> dict[str, tuple[str, Callable[..., Figure]]]:
    """Public plot function -> ("fig" or "ax", call taking fig=/ax= or nothing)."""
    from pyro_invariance.data.physics import kepler_conserved
    from pyro_invariance.data.toy2d import plot_extrapolation
    from pyro_invariance.diagnostics import arviz_compat, conserved_analysis, hnn_metrics, layerwise_analysis

    so2 = oracle_generators("so2", 2)
    analysis = pi.symmetry.conserved.analyse_generators(so2, so2)
    mlp = _invariant_mlp("relu", 0.5)
    sites = {"blocks.0.conv.weight": torch.randn(3, 9)}
    history = {"a": _history({"rot": [0.5] * 30})}
    return {
        "plots.plot_eta_history": ("fig", lambda **kw: plots.plot_eta_history(history, **kw)),
        "plots.plot_filter_bank": ("fig", lambda **kw: plots.plot_filter_bank(mlp, rows=(0,), num=2, **kw)),
        "plots.plot_filter_banks": ("fig", lambda **kw: plots.plot_filter_banks(sites, **kw)),
        "plots.plot_generators": (
            "fig",
            lambda **kw: plots.plot_generators({"rot": 1.0}, image=torch.rand(8, 8), num_examples=2, **kw),
        ),
        "plots.plot_conserved_quantities": ("fig", lambda **kw: plots.plot_conserved_quantities(so2, **kw)),
        "plots.plot_orbits": ("fig", lambda **kw: plots.plot_orbits(mlp, num=2, steps=3, **kw)),
        "hnn_metrics.plot_symmetry_analysis": ("fig", lambda **kw: hnn_metrics.plot_symmetry_analysis(analysis, **kw)),
        "hnn_metrics.plot_generators": ("fig", lambda **kw: hnn_metrics.plot_generators([so2[0]], ["G"], **kw)),
        "layerwise_analysis.plot_pathways": (
            "fig",
            lambda **kw: layerwise_analysis.plot_pathways(_layerwise_reports(), **kw),
        ),
        "conserved_analysis.plot_level_sets": (
            "fig",
            lambda **kw: conserved_analysis.plot_level_sets(
                lambda x: x[:, :1] * x[:, 3:], kepler_conserved, torch.tensor([1.0, 0.0, 0.0, 1.0]), points=9, **kw
            ),
        ),
        "toy2d.plot_extrapolation": (
            "fig",
            lambda **kw: plot_extrapolation({"p": np.full(121, 0.5)}, grid_size=11, **kw),
        ),
        "compare.GuideComparison.plot": ("ax", lambda **kw: _comparison().plot(**kw)),
        "arviz_compat.plot_posterior": (
            "ax",
            lambda **kw: arviz_compat.plot_posterior(_idata(), var_names=["mu"], **kw),
        ),
        "arviz_compat.plot_forest": ("ax", lambda **kw: arviz_compat.plot_forest(_idata(), var_names=["mu"], **kw)),
    }


CASES = list(_cases())


def test_every_plot_function_of_the_package_is_covered():
    found = set()
    for path in (REPO / "pyro_invariance").rglob("*.py"):
        module = path.stem
        for name in re.findall(r"^def (plot_\w+)\(", path.read_text(), flags=re.MULTILINE):
            found.add(f"{module}.{name}")
        if re.search(r"^    def plot\(", path.read_text(), flags=re.MULTILINE):
            found.add(f"{module}.GuideComparison.plot")
    assert found == set(CASES)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:Passing a dict or None as alias_mapping")  # ArviZ 0.23
@pytest.mark.parametrize("name", CASES)
def test_plot_draws_into_the_given_figure_or_axes_and_returns_the_figure(name):
    kind, call = _cases()[name]
    if kind == "fig":
        fig = plt.figure()
        assert call(fig=fig) is fig and fig.axes
    else:
        fig, ax = plt.subplots()
        if name.startswith("arviz_compat") and not pi.diagnostics.arviz_compat.is_legacy():
            with pytest.raises(ValueError, match="draws its own figure"):  # ArviZ 1.x lays out its own
                call(ax=ax)
        else:
            assert call(ax=ax) is fig and fig.axes == [ax] and ax.has_data()
    new = call()
    assert isinstance(new, Figure) and new is not fig and new.axes


def test_no_backend_switching_in_the_package():
    offenders = [
        f"{path.relative_to(REPO)}:{i}"
        for folder in PACKAGE_DIRS
        for path in folder.rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if "matplotlib.use" in line
    ]
    assert offenders == []


def test_plotting_keeps_the_backend_chosen_by_the_user(tmp_path):
    code = (
        "import matplotlib, pyro_invariance; from pyro_invariance.diagnostics import plots; "
        "plots.save_figure(plots.plot_generators({'rot': 1.0}), 'g.svg'); print(matplotlib.get_backend())"
    )
    env = {**os.environ, "MPLBACKEND": "svg"}
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().lower() == "svg" and (tmp_path / "g.svg").stat().st_size > 0

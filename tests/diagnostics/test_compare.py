"""The guide-comparison workbench: ``compare_guides`` and ``pyro-invariance compare``."""

import json

import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample

import pyro_invariance as pi
from pyro_invariance.cli import main
from pyro_invariance.models.basis_regression import make_symmetric_toy
from pyro_invariance.registry import UnknownNameError

torch.set_num_threads(1)

THREE = ["mean-field", "matrix-normal", "block-cholesky"]


def _toy_model():
    return pi.models.get(
        "basis-regression",
        in_features=1,
        out_features=2,
        num_features=8,
        lengthscale=0.6,
        prior_scale=0.5,
        noise_scale=0.3,
        eta_init=0.4,
        learn_symmetry=True,
    )


@pytest.fixture(scope="module")
def toy():
    return make_symmetric_toy(30, seed=4, noise=0.3, even=True, num_outputs=2)


@pytest.fixture(scope="module")
def comparison(toy):
    model = _toy_model()
    cmp = pi.compare_guides(
        model,
        toy,
        THREE + ["map"],
        steps=60,
        batch_size=None,
        lr=0.1,
        seed=3,
        K=(10, 100),
        bound_samples=300,
        eval_samples=4,
        bound_vectorize=True,
        guide_kwargs={"mean-field": {"init_scale": 0.1}},
    )
    return model, cmp


def test_api_rows_bounds_and_metrics(comparison, toy):
    model, cmp = comparison
    assert [r["guide"] for r in cmp.rows] == THREE + ["map"]
    assert cmp.kind == "regression" and cmp.Ks == (10, 100) and cmp.settings["n_eval"] == 30
    for r in cmp.rows:
        assert r["params"] > 0 and r["seconds_per_step"] > 0 and r["n_eval"] == 30
        assert set(r["eta"]) == {"lambda"} and "lambda=" in r["eta_readable"]
        assert {"rmse", "nll", "log_evidence_per_datum"} <= set(r["metrics"])
        assert r["log_evidence"] is not None  # exact evidence at this row's learned λ
        if r["guide"] == "map":
            assert not r["is_bound"] and r["k_hat"] != r["k_hat"]  # NaN
            continue
        assert r["is_bound"]
        assert r["elbo"] <= r["iwae10"] + 3 * r["iwae10_se"] <= r["iwae100"] + 3 * (r["iwae10_se"] + r["iwae100_se"])
        assert r["iwae100"] <= r["log_evidence"] + 3 * r["iwae100_se"] + 1e-4
    # every guide was fitted on its own copy: the instance passed in is untouched
    assert float(model.lam.detach()) == pytest.approx(0.4)
    assert all(res.model is not model for res in cmp.results.values())
    params = {r["guide"]: r["params"] for r in cmp.rows}
    assert params["map"] < params["mean-field"] < params["block-cholesky"]


def test_api_renders_text_markdown_json_and_plot(comparison, tmp_path):
    _, cmp = comparison
    text = cmp.to_text()
    for word in ("guide", "ELBO/N", "IWAE10/N", "IWAE100/N", "log Z/N", "k̂", "test RMSE", *THREE, "map"):
        assert word in text
    assert "not a bound" in text
    md = cmp.to_markdown().splitlines()
    assert md[0].startswith("| guide |") and sum(line.startswith("| ") for line in md) == 1 + 4
    payload = json.loads(cmp.to_json())
    assert [r["guide"] for r in payload["rows"]] == THREE + ["map"]
    assert payload["rows"][-1]["k_hat"] is None  # NaN → null in JSON
    files = cmp.save(tmp_path / "out")
    assert files["markdown"].read_text().startswith("| guide |")
    assert json.loads(files["json"].read_text())["Ks"] == [10, 100]
    assert files["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_seed_same_result(toy):
    kw = dict(steps=20, batch_size=None, seed=1, K=(10,), bound_samples=50, eval_samples=2, bound_vectorize=True)
    a = pi.compare_guides(_toy_model, toy, ["mean-field"], **kw)
    b = pi.compare_guides(_toy_model, toy, ["mean-field"], **kw)
    assert a.rows[0]["elbo"] == b.rows[0]["elbo"] and a.rows[0]["eta"] == b.rows[0]["eta"]


# ------------------------------------------------------------------------------------------------
# bad input (all fail before anything is fitted)


class _NoObservation(PyroModule):
    def __init__(self):
        super().__init__()
        self.w = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None, num_data=None):
        return x @ self.w


def test_api_bad_input(toy):
    with pytest.raises(UnknownNameError, match="Did you mean 'mean-field'"):
        pi.compare_guides(_toy_model(), toy, ["mean-feild", "map"])
    for bad in (0, -3, (10, 0), 1.5):
        with pytest.raises(ValueError, match="K must be an integer >= 1"):
            pi.compare_guides(_toy_model(), toy, ["map"], K=bad)
    with pytest.raises(ValueError, match="no observed sample site"):
        pi.compare_guides(_NoObservation(), (torch.randn(8, 1), torch.randn(8)), ["mean-field"])
    with pytest.raises(ValueError, match="eval_subset=99 exceeds"):
        pi.compare_guides(_toy_model(), toy, ["map"], eval_subset=99)
    with pytest.raises(ValueError, match="not compared"):
        pi.compare_guides(_toy_model(), toy, ["map"], guide_kwargs={"mean-field": {}})
    with pytest.raises(UnknownNameError, match="unknown model"):
        pi.compare_guides("invariant-mpl", toy, ["map"])


# ------------------------------------------------------------------------------------------------
# CLI


def test_cli_compare_three_guides_on_rotated_digits(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(
        [
            "compare",
            "--model",
            "invariant-mlp",
            "--data",
            "rotated-digits",
            "--guides",
            ",".join(THREE),
            "--steps",
            "30",
            "--model-arg",
            "hidden=32",
            "--model-arg",
            "num_transforms=4",
            "--train-size",
            "200",
            "--test-size",
            "50",
            "--eval-samples",
            "2",
            "--K",
            "10,100",
            "--eval-subset",
            "100",
            "--format",
            "markdown",
            "--no-progress",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "| guide | params | s/step | ELBO/N | IWAE10/N | IWAE100/N |" in printed
    for name in THREE:
        assert f"| {name} |" in printed
    assert "rot=" in printed and "test acc" in printed and "first 100 of the 200 training points" in printed
    payload = json.loads((out / "table.json").read_text())
    assert payload["settings"]["n_eval"] == 100 and len(payload["rows"]) == 3
    assert all(0.0 <= r["metrics"]["accuracy"] <= 1.0 for r in payload["rows"])
    assert (out / "bounds.png").stat().st_size > 0 and (out / "table.md").read_text().startswith("| guide |")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--guides", "mean-field,matrix-normall"], "unknown guide 'matrix-normall'. Did you mean 'matrix-normal'"),
        (["--K", "10,0"], "K must be an integer >= 1"),
        (["--K", "-5"], "K must be an integer >= 1"),
        (["--K", "ten"], "--K must be a comma-separated list of integers"),
        (["--guide-arg", "low-rank:rank=2"], "not in --guides"),
    ],
)
def test_cli_compare_bad_input_exit_2(args, message, capsys):
    code = main(
        [
            "compare",
            "--model",
            "invariant-mlp",
            "--data",
            "rotated-digits",
            "--guides",
            "mean-field,map",
            "--no-progress",
            *args,
        ]
    )
    assert code == 2
    assert message in capsys.readouterr().err

"""The lengthscale probe (``research/uncertain_symmetry/scripts/uncertain_symmetry_lengthscale.py``): its
settings, a tiny real run that passes the lengthscale to the model and resumes, and the table from synthetic
units with the ℓ = 1 check."""

from __future__ import annotations

import json
import math

import pytest

from research.uncertain_symmetry.tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_lengthscale")


def test_settings(bench) -> None:
    assert bench.LENGTHSCALES[0] == 1.0 and (bench.DATASETS, bench.SIZE, bench.SEED) == (
        ("upright", "partially-rotated"),
        1200,
        0,
    )
    assert set(bench.ETAS) <= set(bench.usd.ETAS) and 2.35 in bench.ETAS and bench.ETAS[-1] == math.pi


def test_a_tiny_run_uses_the_lengthscale_and_resumes(bench, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "ETAS", (0.6,))
    monkeypatch.setattr(bench.usd, "NUM_SCALES", 2)
    monkeypatch.setattr(bench.usd, "HELDOUT_DRAWS", 8)
    data = bench.usd.load("upright", 40)
    short, long = (
        bench.run_unit("upright", ell, bench.unit_path(tmp_path, "upright", ell, 0), data=data) for ell in (1.0, 4.0)
    )
    assert short["points"][0]["log_evidence"] != long["points"][0]["log_evidence"]
    default = bench.usd.evaluate_point(data, 0, 0.6)  # the model's default ℓ is 1 on 8×8 digits
    assert default["log_evidence"] == pytest.approx(short["points"][0]["log_evidence"], abs=1e-9)
    monkeypatch.setattr(bench.usd, "evaluate_point", lambda *a, **k: pytest.fail("a finished point ran again"))
    assert bench.run_unit("upright", 4.0, bench.unit_path(tmp_path, "upright", 4.0, 0), data=data) == long


def test_render(bench, tmp_path) -> None:
    work, ds = tmp_path / "units", tmp_path / "ds"
    work.mkdir(), ds.mkdir()
    for ell, top in ((1.0, 2.35), (2.0, 1.1), (4.0, 0.6)):
        pts = [
            {
                "eta": e,
                "log_evidence": -500.0 - 10 * (e - top) ** 2 + ell,
                "nll": 0.7 + 0.01 * (e - top) ** 2,
                "accuracy": 0.95,
            }
            for e in bench.ETAS
        ]
        bench.unit_path(work, "upright", ell, 0).write_text(json.dumps({"lengthscale": ell, "points": pts}))
    for ell in (1.0, 2.0):  # ±90°: rendered per dataset, its own best top; ℓ = 4 missing: left out
        pts = [
            {"eta": e, "log_evidence": -700.0 - 5 * (e - 2.85) ** 2, "nll": 0.7, "accuracy": 0.9} for e in bench.ETAS
        ]
        bench.unit_path(work, "partially-rotated", ell, 1).write_text(json.dumps({"lengthscale": ell, "points": pts}))
    same = [
        {"eta": e, "log_evidence": -500.0 - 10 * (e - 2.35) ** 2 + 1.0 + (0.5 if e == 0.1 else 0.0)}
        for e in bench.usd.ETAS
    ]
    for k in (0, 1):
        bench.usd.unit_path(ds, "upright", 1200, 0, k).write_text(json.dumps({"points": same[k::2]}))
    md, js = bench.render(work, ds, tmp_path)
    out = json.loads(js.read_text())
    assert [u["top_eta"] for u in out["units"]] == [2.35, 1.1, 0.6, 2.6, 2.6] and out["check"] == pytest.approx(0.5)
    text = md.read_text()
    assert (
        "| upright | 4 | 0.60 / -496.0 |" in text
        and "| partially-rotated | 2 | 2.60 / -700.3 | 37.5 | -37.5 / " in text
    )

"""The 28×28 benchmark (``research/uncertain_symmetry/scripts/uncertain_symmetry_resolution.py``): its
settings, a tiny real run on Fashion-MNIST that resumes, and the tables from synthetic units."""

from __future__ import annotations

import json
import math

import pytest

from pyro_invariance.data.images import load_dataset
from research.uncertain_symmetry.tests.helpers import load_script, write_mnist_like


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_resolution")


def test_settings(bench) -> None:
    assert bench.DATASETS == {"upright": "fashion-mnist", "partially-rotated": "partially-rotated-fashion-mnist"}
    assert bench.ETAS == bench.usls.ETAS and bench.SIZE == 1200 and bench.SEEDS == (0, 1, 2)


def test_a_tiny_run_on_28x28_images_resumes(bench, tmp_path, monkeypatch) -> None:
    # small 28×28 IDX files written here stand in for Debian's dataset-fashion-mnist, which a fresh machine lacks
    write_mnist_like(tmp_path / "idx", n_train=30, n_test=12)
    monkeypatch.setattr(
        bench,
        "load",
        lambda name, size: load_dataset(bench.DATASETS[name], data_dir=tmp_path / "idx", train_size=size, test_size=12),
    )
    monkeypatch.setattr(bench, "ETAS", (0.6, 2.1))
    monkeypatch.setattr(bench.usd, "NUM_SCALES", 3)
    monkeypatch.setattr(bench.usd, "HELDOUT_DRAWS", 8)
    data = bench.load("partially-rotated", 30)
    assert data.image_shape == (1, 28, 28)
    unit = bench.run_unit("partially-rotated", 1, bench.unit_path(tmp_path, "partially-rotated", 1, 1), 1, 2, data)
    assert unit["images"] == "partially-rotated-fashion-mnist" and [p["eta"] for p in unit["points"]] == [2.1]
    assert unit["points"][0]["log_evidence"] == pytest.approx(
        bench.usd.evaluate_point(data, 1, 2.1)["log_evidence"], abs=1e-9
    )
    fine = bench.run_unit(
        "partially-rotated", 1, bench.unit_path(tmp_path, "partially-rotated", 1, 0, refine=True), 0, 1, data, (1.35,)
    )
    assert [p["eta"] for p in fine["points"]] == [1.35] and [
        p["eta"] for p in bench.unit_points(tmp_path, "partially-rotated", 1, refine=True)
    ] == [1.35, 2.1]
    monkeypatch.setattr(bench.usd, "evaluate_point", lambda *a, **k: pytest.fail("a finished point ran again"))
    assert (
        bench.run_unit("partially-rotated", 1, bench.unit_path(tmp_path, "partially-rotated", 1, 1), 1, 2, data) == unit
    )


def test_render(bench, tmp_path) -> None:
    def pts(top: float, etas: tuple[float, ...]) -> list[dict]:
        return [
            {"eta": e, "log_evidence": -600.0 - 20 * (e - top) ** 2, "nll": 0.6 + 0.1 * abs(e - top), "accuracy": 0.8}
            for e in etas
        ]

    for seed, top in ((0, 0.6), (1, 2.35)):  # upright: the criterion holds on one of two seeds
        bench.unit_path(tmp_path, "upright", seed, 0).write_text(json.dumps({"points": pts(top, bench.ETAS[::2])}))
        bench.unit_path(tmp_path, "upright", seed, 1).write_text(json.dumps({"points": pts(top, bench.ETAS[1::2])}))
    bench.unit_path(tmp_path, "partially-rotated", 0, 0).write_text(json.dumps({"points": pts(1.6, bench.ETAS)}))
    bench.unit_path(tmp_path, "partially-rotated", 2, 0).write_text(
        json.dumps({"points": pts(1.6, bench.ETAS[:3])})
    )  # incomplete
    refine = bench.unit_path(tmp_path, "partially-rotated", 0, 0, refine=True)
    refine.write_text(json.dumps({"points": pts(1.6, bench.REFINE_ETAS)}))  # (d): the finer ±90° points
    md, js = bench.render(tmp_path, tmp_path)
    out = json.loads(js.read_text())
    assert [(u["dataset"], u["seed"], u["top_eta"], u["criterion"][0]) for u in out["units"]] == [
        ("upright", 0, 0.6, True),
        ("upright", 1, 2.35, False),
        ("partially-rotated", 0, 1.6, True),
    ]
    text = md.read_text()
    assert (
        "| fashion-mnist | 0, 1 | 1 of 2 | mixed |" in text
        and "| partially-rotated-fashion-mnist | 0 | 1 of 1 | supports" in text
    )
    assert [u["etas"] for u in out["refined"]] == [sorted(bench.ETAS + bench.REFINE_ETAS)] and out["units"][2][
        "etas"
    ] == list(bench.ETAS)
    assert "Criterion holds on the finer grid on 1 of 1 seeds." in text
    assert "(\\|Δ\\| 0.03)" in text and math.isclose(out["units"][2]["nll_at_top"], 0.0)


@pytest.mark.parametrize("seeds", ["7", "0,x", ""])
def test_bad_seeds_are_refused_in_one_line(bench, tmp_path, seeds: str, capsys) -> None:
    with pytest.raises(SystemExit) as err:
        bench.main(["--run", "--seeds", seeds, "--work-dir", str(tmp_path)])
    assert err.value.code == 2 and "--seeds must be comma-separated seeds from (0, 1, 2)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was run or written

"""The lengthscale-marginal benchmark
(``research/uncertain_symmetry/scripts/uncertain_symmetry_lengthscale_marginal.py``): its settings, where each
point comes from, η's posterior with ℓ chosen and integrated out against a direct computation, a tiny real run
(and AIS check) that resumes, and the tables from synthetic units."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest

from research.uncertain_symmetry.tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("uncertain_symmetry_lengthscale_marginal")


def curve(bench, top: float, height: float, etas: tuple[float, ...] | None = None) -> list[dict]:
    return [
        {"eta": e, "log_evidence": height - 10.0 * (e - top) ** 2, "nll": 0.5 + 0.01 * (e - top) ** 2, "accuracy": 0.9}
        for e in (bench.ETAS if etas is None else etas)
    ]


def test_settings(bench) -> None:
    assert bench.LENGTHSCALES[:2] == (1.0, 2.0) and bench.LENGTHSCALES[-1] == 4.0 and bench.SEEDS == (0, 1, 2)
    assert bench.ETAS == bench.usls.ETAS and bench.SIZE == bench.usls.SIZE == 1200
    # ℓ = 1 is never run (the data-size points), nor seed 0 at the probe's ℓ; 2√2 runs last
    assert all(e != 1.0 and not (s == 0 and e in bench.usls.LENGTHSCALES) for s, _, e in bench.RUN_ORDER)
    assert {e for *_, e in bench.RUN_ORDER[-6:]} == {2 * math.sqrt(2)}
    assert {eta for *_, eta in bench.AIS_CHECK} <= set(bench.ETAS) and bench.AIS_CHECK[0][0] == 300


def test_points_come_from_the_named_source(bench, tmp_path) -> None:
    own, probe, ds = tmp_path / "own", tmp_path / "probe", tmp_path / "ds"
    for d in (own, probe, ds):
        d.mkdir()
    full = [{"eta": e, "log_evidence": -1.0 * e} for e in bench.usd.ETAS]  # the data-size grid holds ETAS and more
    bench.usd.unit_path(ds, "upright", 1200, 1, 0).write_text(json.dumps({"points": full}))
    bench.usls.unit_path(probe, "upright", 2.0, 0).write_text(json.dumps({"points": curve(bench, 1.0, -5.0)}))
    bench.unit_path(own, "upright", 2.0, 1, 0).write_text(json.dumps({"points": curve(bench, 1.0, -7.0)[::2]}))
    bench.unit_path(own, "upright", 2.0, 1, 1).write_text(json.dumps({"points": curve(bench, 1.0, -7.0)[1::2]}))
    pts, source = bench.points(own, probe, ds, "upright", 1.0, 1)
    assert source == "data-size" and [p["eta"] for p in pts] == list(bench.ETAS)
    assert bench.points(own, probe, ds, "upright", 2.0, 0)[1] == "probe"
    pts, source = bench.points(own, probe, ds, "upright", 2.0, 1)
    assert source == "this script" and pts == curve(bench, 1.0, -7.0)
    assert bench.points(own, probe, ds, "upright", 4.0, 1) is None  # nothing there
    bench.unit_path(own, "upright", 4.0, 1, 0).write_text(json.dumps({"points": curve(bench, 1.0, -7.0)[:3]}))
    assert bench.points(own, probe, ds, "upright", 4.0, 1) is None  # incomplete


def test_summarise_against_a_direct_computation(bench) -> None:
    units = {2.0: curve(bench, 1.6, -300.0), 4.0: curve(bench, 0.6, -298.0)}
    for p in units[2.0]:  # the held-out NLL prefers ℓ = 2 by 0.01 at its best η
        p["nll"] -= 0.01
    r = bench.summarise("upright", 1, units)
    etas = np.array(bench.ETAS)
    lev = np.array([[p["log_evidence"] for p in units[e]] for e in (2.0, 4.0)])
    # log p(D | ℓ): trapezoid over η of p(D | η, ℓ) / π
    direct = [math.log(np.trapezoid(np.exp(row), etas) / math.pi) for row in lev]
    assert r["log_p_data_given_ell"] == pytest.approx(direct, abs=1e-9) and r["ell_star"] == 4.0
    assert sum(r["p_ell"]) == pytest.approx(1.0) and r["p_ell"][1] == pytest.approx(
        1 / (1 + math.exp(direct[0] - direct[1]))
    )
    mixed = bench.usa.posterior(etas, np.log(np.exp(lev).mean(0)))  # p(D | η) averaged over the ℓ grid, then U(0, π)
    assert r["integrated"]["mean"] == pytest.approx(mixed.mean, abs=1e-9) and r["integrated"]["sd"] == pytest.approx(
        mixed.sd, abs=1e-9
    )
    assert r["at_ell_star"]["mode"] == 0.6 and r["at_ell_star_criterion"][0]
    assert r["joint_top"] == [4.0, 0.6] and r["best_nll"][:2] == [2.0, 1.6] and r["nll_at_top"] == pytest.approx(0.01)


def test_a_tiny_run_and_ais_check_resume(bench, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "ETAS", (0.6,))
    monkeypatch.setattr(bench, "AIS_CHECK", ((40, 2.0, 0.6), (60, 4.0, 0.6)))
    monkeypatch.setattr(bench, "SIZE", 60)
    monkeypatch.setattr(bench.usd, "NUM_SCALES", 2)
    monkeypatch.setattr(bench.usd, "HELDOUT_DRAWS", 8)
    data = bench.usd.load("upright", 40)
    unit = bench.run_item("upright", 4.0, 1, bench.unit_path(tmp_path, "upright", 4.0, 1, 0), data=data)
    again = bench.usd.evaluate_point(data, 1, 0.6, lengthscale=4.0)
    assert unit["lengthscale"] == 4.0 and unit["points"][0]["log_evidence"] == pytest.approx(
        again["log_evidence"], abs=1e-9
    )
    assert again["log_evidence"] != pytest.approx(
        bench.usd.evaluate_point(data, 1, 0.6)["log_evidence"], abs=1e-3
    )  # ℓ reached the model
    monkeypatch.setattr(
        bench.usa, "evaluate_point", functools.partial(bench.usa.evaluate_point, chains=2, temperatures=4)
    )
    first = bench.run_ais_check(tmp_path, 0)
    assert [(p["size"], p["lengthscale"]) for p in first["points"]] == [(40, 2.0), (60, 4.0)]
    lap = json.loads((tmp_path / "ais_check_laplace.json").read_text())["points"]
    assert [(p["size"], p["lengthscale"]) for p in lap] == [(40, 2.0)]  # N = SIZE's Laplace points come from (b)
    monkeypatch.setattr(bench.usa, "evaluate_point", lambda *a, **k: pytest.fail("a finished AIS point ran again"))
    monkeypatch.setattr(bench.usd, "evaluate_point", lambda *a, **k: pytest.fail("a finished Laplace point ran again"))
    assert bench.run_ais_check(tmp_path, 0) == first


def test_render(bench, tmp_path) -> None:
    own, probe, ds = tmp_path / "own", tmp_path / "probe", tmp_path / "ds"
    for d in (own, probe, ds):
        d.mkdir()
    for seed in bench.SEEDS:  # upright: ℓ = 4 wins with its top at 0.6 on every seed; ±90°: seed 0 only, at π
        bench.usd.unit_path(ds, "upright", 1200, seed, 0).write_text(
            json.dumps({"points": curve(bench, 2.35, -400.0, bench.usd.ETAS)})
        )
        for ell, top, height in ((2.0, 1.6, -310.0), (4.0, 0.6, -300.0)):
            path = (
                bench.usls.unit_path(probe, "upright", ell, 0)
                if seed == 0
                else bench.unit_path(own, "upright", ell, seed, 0)
            )
            path.write_text(json.dumps({"points": curve(bench, top, height)}))
    bench.usd.unit_path(ds, "partially-rotated", 1200, 0, 0).write_text(
        json.dumps({"points": curve(bench, math.pi, -500.0, bench.usd.ETAS)})
    )
    bench.usls.unit_path(probe, "partially-rotated", 2.0, 0).write_text(
        json.dumps({"points": curve(bench, math.pi, -490.0)})
    )
    md, js = bench.render(own, probe, ds, tmp_path)
    out = json.loads(js.read_text())
    assert [(u["dataset"], u["seed"], u["ell_star"]) for u in out["units"]] == [
        ("upright", 0, 4.0),
        ("upright", 1, 4.0),
        ("upright", 2, 4.0),
        ("partially-rotated", 0, 2.0),
    ]
    assert out["sources"] == {"data-size": 32, "probe": 24, "this script": 32} and out["ais_check"] is None
    text = md.read_text()
    assert "| upright | 0, 1, 2 | 3 of 3 | 3 of 3 (2 of 2) |" in text and text.count("| yes |") == 1
    assert (
        "| partially-rotated | 0 | 0 of 1 | 0 of 1 (0 of 0) | 2.9" in text
        and "(\\|Δ\\| " in text
        and "(|Δ|" not in text
    )


def test_the_ais_table_and_its_reading(bench, tmp_path) -> None:
    own, probe = tmp_path / "own", tmp_path / "probe"
    own.mkdir(), probe.mkdir()
    ais = {(300, 2.0): -100.0, (300, 4.0): -95.0, (1200, 2.0): -300.0, (1200, 4.0): -290.0}
    lap = {(300, 2.0): -110.0, (300, 4.0): -108.0, (1200, 2.0): -310.0, (1200, 4.0): -318.0}  # Laplace: ℓ = 2 at 1200
    for half, shift in ((0, 0.5), (1, -0.5)):
        pts = [
            {
                "size": n,
                "lengthscale": e,
                "eta": eta,
                "log_evidence": ais[(n, e)] + shift,
                "weight_sd": 2.0,
                "log_weights": [ais[(n, e)] + shift] * 4,
            }
            for n, e, eta in bench.AIS_CHECK
        ]
        (own / f"ais_check_half{half}.json").write_text(json.dumps({"points": pts}))
    assert bench.ais_check(own, probe) is None  # no Laplace points at N = 1200 yet
    (own / "ais_check_laplace.json").write_text(
        json.dumps(
            {
                "points": [
                    {"size": n, "lengthscale": e, "eta": eta, "log_evidence": lap[(n, e)]}
                    for n, e, eta in bench.AIS_CHECK
                    if n == 300
                ]
            }
        )
    )
    for ell in (2.0, 4.0):
        bench.usls.unit_path(probe, "upright", ell, 0).write_text(
            json.dumps(
                {
                    "points": [
                        {"eta": e, "log_evidence": lap[(1200, ell)], "nll": 0.5, "accuracy": 0.9} for e in bench.ETAS
                    ]
                }
            )
        )
    rows = bench.ais_check(own, probe)
    # the combined estimate is the log mean of both runs' weights (e^{±0.5} around the value), not their average
    assert [r["ais"] for r in rows][:2] == pytest.approx([-100.0 + math.log(math.cosh(0.5))] * 2) and rows[0][
        "noise"
    ] == pytest.approx(0.5)
    text = "\n".join(bench.ais_table(rows))
    assert "| 1200 | 0.60 | 10.0 | -8.0 | no |" in text and "| 300 | 1.60 | 5.0 | 2.0 | yes |" in text
    assert "**not confirmed" in text
    assert (
        "At N = 1200: AIS − Laplace from 10.1 to 28.1 nats, per-chain log-weight sd 2.0–2.0." in text
    )  # AIS's own state


def test_the_edge_check_widens_the_scale_grid_and_its_table(bench, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "ETAS", (0.6, 1.6))
    monkeypatch.setattr(bench, "SIZE", 40)
    monkeypatch.setattr(bench, "EDGE_CHECK", (("upright", 1),))
    monkeypatch.setattr(bench, "EDGE_SCALES", 5)
    unit = bench.run_edge_check(tmp_path, 1, 2)
    assert [(p["dataset"], p["seed"], p["eta"]) for p in unit["points"]] == [("upright", 1, 1.6)]
    data = bench.usd.load("upright", 40)
    model = bench.usa.make_model(data, 1, 1.6, lengthscale=4.0)
    again = bench.laplace_readout_evidence(
        model, *bench.train_arrays(data, model), num_scales=5, scale_span=bench.EDGE_SPAN
    )
    assert unit["points"][0]["log_evidence"] == pytest.approx(again.log_evidence, abs=1e-9)
    monkeypatch.setattr(bench, "laplace_readout_evidence", lambda *a, **k: pytest.fail("a finished point ran again"))
    assert bench.run_edge_check(tmp_path, 1, 2) == unit
    # the table: stored ℓ = 4 curve vs a widened one 0.5 nats higher everywhere
    units = {2.0: curve(bench, 1.6, -300.0), 4.0: curve(bench, 0.6, -303.0)}
    for p in units[4.0]:
        p["edge_share"] = 0.1
    row = bench.summarise("upright", 1, units)
    assert row["edge_share"][1] == 0.1 and math.isnan(row["edge_share"][0])
    wide = [
        {"dataset": "upright", "seed": 1, "eta": p["eta"], "log_evidence": p["log_evidence"] + 0.5, "edge_share": 1e-9}
        for p in units[4.0]
    ]
    table_dir = tmp_path / "table"
    table_dir.mkdir()
    (table_dir / "edge_check_part0.json").write_text(json.dumps({"points": wide}))
    text = "\n".join(bench.edge_table(table_dir, [row]))
    before = row["log_p_data_given_ell"][1] - max(row["log_p_data_given_ell"])
    assert f"| upright | 1 | 0.50 / 0.50 | 0.100 → 1.0e-09 | {before:.1f} → {before + 0.5:.1f} |" in text
    assert (
        bench.edge_table(table_dir, [bench.summarise("upright", 1, {2.0: units[2.0], 1.0: units[2.0]})]) == []
    )  # no ℓ = 4


def test_fill_unit_evaluates_only_missing_keys_in_order_and_resumes(bench, tmp_path) -> None:
    path, calls = tmp_path / "unit.json", []

    def evaluate(key: int) -> dict:
        calls.append(key)
        if key == 3:
            raise KeyboardInterrupt  # a run stopped mid-way keeps every point before it
        return {"k": key, "v": key * key}

    with pytest.raises(KeyboardInterrupt):
        bench.common.fill_unit(path, {"name": "u"}, [1, 2, 3], lambda p: p["k"], evaluate)
    assert json.loads(path.read_text()) == {"name": "u", "points": [{"k": 1, "v": 1}, {"k": 2, "v": 4}]}
    assert not path.with_suffix(".partial").exists()
    calls.clear()
    unit = bench.common.fill_unit(
        path, {"name": "ignored"}, [2, 4, 1], lambda p: p["k"], lambda k: calls.append(k) or {"k": k, "v": -k}
    )
    assert unit == json.loads(path.read_text()) and unit["name"] == "u"  # the stored header is kept
    assert [p["k"] for p in unit["points"]] == [1, 2, 4] and calls == [4]  # only 4 was missing

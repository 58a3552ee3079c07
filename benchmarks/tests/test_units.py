"""The benchmarks' one resumable runner (``_common.fill_unit`` and ``unit_points``): a unit file gains a point
per key, is replaced whole after each, resumes without rerunning finished keys, and ``--part k/n`` processes
give the serial run's numbers; gathering the parts refuses missing keys unless asked for a partial table."""

from __future__ import annotations

import argparse
import json

import _common as common
import pytest
import torch


def toy_point(key: tuple[int, float]) -> dict:
    """A cheap seeded "fit": a few steps of gradient descent from a random start."""
    seed, lr = key
    torch.manual_seed(seed)
    a = torch.randn(16, 16, dtype=torch.float64)
    w = torch.randn(16, dtype=torch.float64)
    for _ in range(20):
        w = w - lr * (a.T @ (a @ w))
    return {"seed": seed, "lr": lr, "loss": float((a @ w).square().sum())}


def key_of(point: dict) -> tuple[int, float]:
    return point["seed"], point["lr"]


KEYS = [(seed, 0.01) for seed in range(5)]


def test_a_unit_resumes_without_rerunning_finished_keys(tmp_path):
    path, calls = tmp_path / "unit.json", []

    def counted(key):
        calls.append(key)
        return toy_point(key)

    unit = common.fill_unit(path, {"stem": "toy"}, KEYS[:3], key_of, counted)
    assert unit["stem"] == "toy" and [key_of(p) for p in unit["points"]] == KEYS[:3]
    assert json.loads(path.read_text()) == unit and not list(tmp_path.glob("*.partial"))
    unit = common.fill_unit(path, {"stem": "toy"}, KEYS, key_of, counted)  # a grown table: only the new keys run
    assert calls == KEYS and [key_of(p) for p in unit["points"]] == KEYS


def test_a_stopped_run_keeps_every_finished_point(tmp_path):
    path = tmp_path / "unit.json"

    def fails_at_3(key):
        if key[0] == 3:
            raise RuntimeError("stopped")
        return toy_point(key)

    with pytest.raises(RuntimeError, match="stopped"):
        common.fill_unit(path, {}, KEYS, key_of, fails_at_3)
    assert [key_of(p) for p in json.loads(path.read_text())["points"]] == KEYS[:3]
    assert len(common.fill_unit(path, {}, KEYS, key_of, toy_point)["points"]) == 5


def test_parts_give_the_serial_numbers_and_gathering_refuses_missing_keys(tmp_path):
    serial = [toy_point(k) for k in KEYS]
    paths = [tmp_path / f"part{k}of2.json" for k in range(2)]
    common.fill_unit(paths[0], {}, KEYS[0::2], key_of, toy_point)
    with pytest.raises(ValueError, match=r"2 of 5 units have no result yet \(first: \(1, 0.01\)\)"):
        common.unit_points(paths[:1], KEYS, key_of)
    assert common.unit_points(paths[:1], KEYS, key_of, partial=True) == serial[0::2]
    common.fill_unit(paths[1], {}, KEYS[1::2], key_of, toy_point)
    assert common.unit_points(paths, KEYS, key_of) == serial  # bit-identical floats, in key order, through JSON


def test_parse_part_and_verdict_words():
    parser = argparse.ArgumentParser()
    assert common.parse_part(parser, "1/3") == (1, 3)
    for bad in ("3/3", "x", "-1/2"):
        with pytest.raises(SystemExit):
            common.parse_part(parser, bad)
    assert [common.verdict_of(c) for c in ([True, True], [True, False], [False])] == [
        "reproduced",
        "partly reproduced",
        "not reproduced",
    ]
    text = common.verdict_section("partly reproduced", "3 of 3 seeds", ["- a criterion"])
    assert text.startswith("## Verdict\n\n**Partly reproduced** (3 of 3 seeds).\n\n- a criterion")
    with pytest.raises(ValueError, match="not one of"):
        common.verdict_section("mostly", "1 seed")

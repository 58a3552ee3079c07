"""The start-health measures of ``research.layerwise_init``: they read the fit's start, agree with a direct
forward pass, and the script runs end to end (digits, seconds)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from pyro_invariance.data.images import build_dataset
from pyro_invariance.models.layerwise import LayerwiseNet
from research.layerwise_init.start_health import map_trace, start_activity

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def digits():
    torch.set_num_threads(1)
    return build_dataset("digits", "regular", train_size=64, test_size=32)


def _model(data) -> LayerwiseNet:
    return LayerwiseNet("f-fc+conv+gconv", image_shape=data.image_shape, num_classes=10, alpha=1, prior="fixed")


def test_start_activity_is_the_seeds_start(digits) -> None:
    a, b, c = (start_activity(_model(digits), digits, seed, images=32) for seed in (0, 0, 1))
    assert a == b  # the start depends on the seed only
    assert a != c
    assert len(a["blocks"]) == 8 and all(0.0 <= s <= 1.0 for s in a["active"])
    assert a["logit_sd"] >= 0.0


def test_nll_trace_starts_near_chance_and_falls(digits) -> None:
    trace = map_trace(_model(digits), digits, seed=1, steps=40, lr=1e-2, at=lambda k: k in (1, 20, 40))
    assert [p["step"] for p in trace] == [1, 20, 40]
    assert abs(trace[0]["nll"] - math.log(10)) < 0.5
    assert trace[-1]["nll"] < trace[0]["nll"]  # a live start learns on upright digits


def test_the_start_read_equals_the_first_point_of_a_trace_at_a_tiny_rate(digits) -> None:
    start = start_activity(_model(digits), digits, 1, images=32)
    trace = map_trace(_model(digits), digits, seed=1, steps=1, lr=1e-9, at=lambda k: True, images=32)
    assert trace[0]["nll"] == pytest.approx(start["nll"]) and trace[0]["active"] == start["active"]


def test_script_smoke(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "research" / "layerwise_init" / "scripts"))
    import start_health as script

    assert script.main(["--smoke", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "start_health_smoke.md").read_text()
    assert "## Reading (fixed before the results)" in text and "| translated | 1 |" in text
    assert "## The first steps on upright data" in text
    assert script.main(["--smoke", "--render", "--out", str(tmp_path)]) == 0  # no fit: the stored numbers
    assert (tmp_path / "start_health_smoke.md").read_text() == text

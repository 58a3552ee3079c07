"""The rate scan of ``research/layerwise_init``: its fixed rule reads the last point, picks the largest rate at
which every seed lives, and the script runs end to end (digits, seconds)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "research" / "layerwise_init" / "scripts"))

import rate_scan  # noqa: E402


def _run(lr: float, seed: int, nll: float, sd: float) -> dict:
    return {
        "lr": lr,
        "seed": seed,
        "points": [{"step": 1, "nll": 0.5, "logit_sd": 1.0}, {"step": 2, "nll": nll, "logit_sd": sd}],
    }


def test_a_run_lives_by_its_last_point_only() -> None:
    assert rate_scan.lives(_run(0.001, 0, math.log(10) - 0.2, 0.3))
    assert not rate_scan.lives(_run(0.001, 0, math.log(10) - 0.05, 0.3))  # hardly below the constant prediction
    assert not rate_scan.lives(_run(0.001, 0, 1.0, 0.01))  # low NLL but the logits ignore the image


def test_the_chosen_rate_is_the_largest_where_every_seed_lives() -> None:
    alive, dead = (1.0, 0.5), (math.log(10), 0.0)
    runs = [_run(0.003, 0, *alive), _run(0.003, 2, *dead), _run(0.001, 0, *alive), _run(0.001, 2, *alive)]
    assert rate_scan.chosen_rate(runs) == 0.001
    assert rate_scan.chosen_rate(runs[:2]) is None


def test_script_smoke(tmp_path: Path) -> None:
    assert rate_scan.main(["--smoke", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "rate_scan_smoke.md").read_text()
    assert "## Reading (fixed before the results)" in text and "| 0.003 | 0 |" in text
    assert rate_scan.main(["--smoke", "--render", "--out", str(tmp_path)]) == 0  # no fit: the stored numbers
    assert (tmp_path / "rate_scan_smoke.md").read_text() == text

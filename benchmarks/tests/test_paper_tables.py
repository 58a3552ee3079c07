"""The paper-table scripts: every committed result file ends with the Verdict its script reads off the file's own
numbers, the results index names every result file of these scripts (and only files that exist), and the scripts'
small sizes still run end to end."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import _common as common
import full_rank_defaults
import guide_comparison
import guide_convergence
import invariant_mlp_tables
import layerwise_kfac
import layerwise_tables
import noether_tables
import pytest

RESULTS = common.RESULTS_DIR
STEMS = (
    "invariant_mlp_tables",
    "noether_tables",
    "threebody_recipe",
    "eta_learning",
    "kepler_noether",
    "layerwise_table",
    "layerwise_seeds",
    "layerwise_cost",
    "layerwise_kfac",
    "full_rank_defaults",
    "guide_comparison",
    "guide_convergence",
)


def own_files() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.md") if p.stem.startswith(STEMS))


def verdict_of_file(path: Path) -> str:
    text = path.read_text()
    return text[text.index("## Verdict") :].rstrip()


@pytest.mark.parametrize("path", own_files(), ids=lambda p: p.stem)
def test_every_result_file_ends_with_a_verdict_in_the_vocabulary(path):
    verdict = verdict_of_file(path)
    assert verdict.count("## ") == 1, "the Verdict is the file's last section"
    word = re.search(r"\*\*(.+?)\*\* \(", verdict).group(1).lower()
    assert word in (*common.VERDICTS, "no paper claim")


def test_the_verdicts_are_the_scripts_reading_of_the_committed_numbers():
    def rows(stem: str) -> dict:
        return json.loads((RESULTS / f"{stem}.json").read_text())["rows"]

    fits = json.loads((RESULTS / "invariant_mlp_tables.json").read_text())
    results = {k: {f: v for f, v in fit.items() if f != "spec"} for k, fit in fits["fits"].items()}
    expected = {
        "invariant_mlp_tables": invariant_mlp_tables.verdict(results, ["1", "2"], 0),
        "layerwise_seeds": layerwise_tables.seeds_verdict(rows("layerwise_seeds")),
    }
    for stem, table in (("layerwise_table1", "1"), ("layerwise_table2", "2"), ("layerwise_table3_kfac", "3")):
        expected[stem] = layerwise_tables.verdict(table, rows(stem))
    for path in RESULTS.glob("layerwise_table3_ffc*.json"):
        expected[path.stem] = layerwise_tables.t3_verdict(rows(path.stem))
    gaps = {k: v["gaps"] for k, v in json.loads((RESULTS / "full_rank_defaults.json").read_text())["results"].items()}
    expected["full_rank_defaults"] = full_rank_defaults.verdict(gaps)
    record = json.loads((RESULTS / "guide_convergence.json").read_text())
    expected["guide_convergence"] = guide_convergence.verdict(
        guide_convergence.collect(record["points"]), record["mean_field_optimum"]
    )
    for path in RESULTS.glob("layerwise_kfac*.md"):
        argv = shlex.split(re.search(r"```\n(.*?)\n```", path.read_text(), re.S).group(1))
        variants = argv[argv.index("--variants") + 1].split(",") if "--variants" in argv else layerwise_kfac.VARIANTS
        criteria = layerwise_kfac.criteria(rows(path.stem), tuple(variants))
        expected[path.stem] = criteria[criteria.index("## Verdict") :]
    for stem, verdict in expected.items():
        assert verdict_of_file(RESULTS / f"{stem}.md") == verdict.rstrip(), stem


def test_tables_rebuilt_from_their_json_files_are_the_committed_ones():
    assert noether_tables.markdown().rstrip() == (RESULTS / "noether_tables.md").read_text().rstrip()
    assert guide_comparison.markdown().rstrip() == (RESULTS / "guide_comparison.md").read_text().rstrip()


def test_the_index_names_every_result_file_of_these_scripts_and_only_files_that_exist():
    index = (common.RESULTS_DIR.parent / "README.md").read_text()
    named = set(re.findall(r"`results/([\w.+-]+\.md)`", index))
    assert {p.name for p in own_files()} <= named
    missing = [name for name in named if not (RESULTS / name).exists()]
    assert not missing
    for script in (
        "invariant_mlp_tables",
        "noether_tables",
        "threebody_recipe",
        "kepler_noether",
        "layerwise_tables",
        "layerwise_kfac",
        "full_rank_defaults",
        "guide_comparison",
        "guide_convergence",
    ):
        assert f"benchmarks/{script}.py" in index


def test_full_rank_defaults_renders_its_committed_table_from_the_committed_gaps():
    record = json.loads((RESULTS / "full_rank_defaults.json").read_text())
    points = [
        {"setting": label, "seed": seed, "gap": gap}
        for label, r in record["results"].items()
        for seed, gap in zip(full_rank_defaults.SEEDS, r["gaps"])
    ]
    markdown, payload = full_rank_defaults.render(points)
    assert payload["results"] == record["results"]
    table = markdown[markdown.index("| settings") :]
    committed = (RESULTS / "full_rank_defaults.md").read_text()
    assert table.rstrip() == committed[committed.index("| settings") :].rstrip()


def test_layerwise_kfac_quick_fit_resumes_and_renders(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    argv = ["--quick", "--seeds", "0", "--variants", "conv", "--methods", "MAP", "--work-dir", str(tmp_path / "units")]
    layerwise_kfac.main([*argv, "--steps", "3"])
    (md,) = tmp_path.glob("layerwise_kfac*.md")
    assert "| CONV | MAP | – |" in md.read_text() and md.read_text().rstrip().endswith("the premise line only).")
    stamp = (tmp_path / "units" / "part0of1.json").stat().st_mtime_ns
    layerwise_kfac.main([*argv, "--steps", "3", "--collect"])  # the finished fit is read, not rerun
    assert (tmp_path / "units" / "part0of1.json").stat().st_mtime_ns == stamp


def test_layerwise_table3_paper_model_quick_fit_resumes_and_renders(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(layerwise_tables, "T3_DATASETS", ("regular",))  # one dataset keeps it to seconds
    argv = ["--table", "3", "--variant", "f-fc+conv+gconv", "--quick", "--seeds", "0", "--base", "digits"]
    argv += ["--size", "8", "--steps", "2", "--lr", "0.003", "--work-dir", str(tmp_path / "units")]
    layerwise_tables.main(argv)
    stem = "layerwise_table3_ffc_digits_seeds0_lr0.003_steps2_quick"  # changed settings are named: no overwrite
    text = (tmp_path / f"{stem}.md").read_text()
    assert json.loads((tmp_path / f"{stem}.json").read_text())["settings"]["lr"] == 0.003
    assert "| regular |" in text and "| regular | GCONV |" in text and text.count("## Verdict") == 1
    (point,) = [p for p in json.loads((tmp_path / "units" / "part0of1.json").read_text())["points"] if "shares" in p]
    shares = point["shares"]["0"]
    assert set(shares) == {"ffc", "conv", "gconv"} and abs(sum(shares.values()) - 1) < 1e-6
    stamp = (tmp_path / "units" / "part0of1.json").stat().st_mtime_ns
    layerwise_tables.main([*argv, "--collect"])  # the finished fits are read, not rerun
    assert (tmp_path / "units" / "part0of1.json").stat().st_mtime_ns == stamp


def test_layerwise_table3_verdict_asks_for_a_rise_on_most_seeds_of_fits_that_did_not_collapse():
    def rows(gconv_rotated: list[float], nll_rotated: float = 0.5, first_seed: int = 0) -> dict:
        out = {}
        for seed, g in enumerate(gconv_rotated, start=first_seed):
            for ds, gconv, conv in (("regular", 0.6, 0.3), ("translated", 0.6, 0.3), ("rotated", g, 0.3)):
                shares = {str(b): {"ffc": 1 - gconv - conv, "conv": conv, "gconv": gconv} for b in range(8)}
                nll = nll_rotated if ds == "rotated" else 0.5
                out[f"Laplace|{ds}|{seed}"] = {"seed": seed, "accuracy": 0.8, "nll": nll, "shares": shares}
        return out

    rise = layerwise_tables.t3_verdict(rows([0.7, 0.7, 0.7]))
    assert (
        "(the paper: +8 on MNIST; here +10.0 points over 3 seeds without a collapsed fit, higher on 3 of 3 seeds): yes"
        in rise
    )
    assert "**Partly reproduced**" in rise  # CONV's share did not rise on translated data
    one_seed = layerwise_tables.t3_verdict(rows([0.9, 0.55, 0.55]))  # the mean rises, but on 1 of 3 seeds
    assert "higher on 1 of 3 seeds): no" in one_seed and "**Not reproduced**" in one_seed
    later = layerwise_tables.t3_verdict(rows([0.7, 0.7, 0.7], first_seed=3))  # the seeds run, not 0, 1, 2
    assert "higher on 3 of 3 seeds): yes" in later and "seeds 3, 4, 5;" in later
    dead = layerwise_tables.t3_verdict(rows([0.7, 0.7, 0.7], nll_rotated=2.3026))  # chance: no shares to compare
    assert "here no seed without one, higher on 0 of 3 seeds): no" in dead and "3 of 9 Laplace fits ended" in dead

"""The prose says what the stored results say: README length, tutorial numbers, no machine paths.

Fast (no notebook is executed): the checks read ``README.md`` and the stored outputs of
``tutorials/*.ipynb``.

The convention that makes a tutorial's numbers checkable (a number in a markdown cell either is a
setting, or quotes a stored output, and then it must match that output at its shown precision):

* **A reading** is a markdown cell without a heading that follows one or more code cells. It reads
  their outputs, so every decimal number in it (``−8.83``, ``0.74``) must be found in the stored
  outputs of those code cells (the ones since the previous markdown cell).
* **A quote** anywhere in a markdown cell: a number in bold (``**3.01 rad**``) or inside the
  parenthesis ``(the saved run: …)`` must be found in the stored outputs of any code cell.
* **The run time**: where a notebook prints ``notebook run time: X min`` (or ``notebook time: X s``), its
  ``**Runtime.**`` paragraph must state X in that unit, and no other duration in that unit.

Numbers in inline code (`` `lr=0.05` ``) and in math (``$\\hat k < 0.7$``) are settings, thresholds or
definitions, not quotes, and are not checked. "Found at the shown precision" means that some number
printed in the outputs rounds to the prose number at the prose number's number of decimals.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.ipynb"))
README_MAX_LINES = 350

# Decimal numbers in prose (unicode minus included); integers are sizes, counts, section numbers.
_PROSE_DECIMAL = re.compile(r"(?<![\w.\-−])([-−]?\d+\.\d+)(?![\w.]*\d)")
# Any number in an output: integers, decimals and scientific notation.
_OUTPUT_NUMBER = re.compile(r"[-−]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_BOLD = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)
_SAVED_RUN = re.compile(r"\(the saved run:([^()]*(?:\([^()]*\)[^()]*)*)\)", re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`]*`")
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$]*\$", re.DOTALL)
_RUN_TIME = re.compile(r"notebook (?:run )?time: (\d+(?:\.\d+)?) (min|s)\b")
_DURATION = {  # a number (or a range "4–5") followed by the unit the notebook printed its time in
    unit: re.compile(r"(\d+(?:\.\d+)?)(?:\s*[–-]\s*(\d+(?:\.\d+)?))?\s*" + pattern)
    for unit, pattern in (("min", r"min(?:utes?)?\b"), ("s", r"(?:s|seconds?)\b"))
}
# Where another machine's files would show in a stored output.
_MACHINE_PATH = re.compile(r"/home/|/work/|/tmp/|/Users/|site-packages|dist-packages|[A-Z]:\\\\Users")


def _text(cell: dict) -> str:
    return "".join(cell["source"])


def _outputs(cell: dict) -> str:
    """Every text a code cell stored: streams, results, errors (images are not text)."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for mime, value in out.get("data", {}).items():
            if mime.startswith("text/") or mime.endswith("json"):
                parts.append(
                    value
                    if isinstance(value, str)
                    else "".join(value)
                    if isinstance(value, list)
                    else json.dumps(value)
                )
        parts.extend(out.get("traceback", []))
    return "\n".join(parts)


def _strip(markdown: str) -> str:
    """Markdown without inline code and math (settings and definitions, not quotes)."""
    return _MATH.sub(" ", _CODE_SPAN.sub(" ", markdown))


def _as_float(text: str) -> float:
    return float(text.replace("−", "-"))


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _output_numbers(text: str) -> list[float]:
    numbers = []
    for match in _OUTPUT_NUMBER.findall(text):
        try:
            numbers.append(_as_float(match))
        except ValueError:
            continue
    return numbers


def _found(number: str, outputs: list[float]) -> bool:
    """Some output number rounds to ``number`` at ``number``'s precision (the sign counts)."""
    value, tol = _as_float(number), 0.5 * 10.0 ** -_decimals(number) + 1e-9
    return any(abs(out - value) <= tol for out in outputs)


def _quoted(markdown: str) -> list[str]:
    """Numbers a markdown cell marks as quotes: in bold, or in ``(the saved run: …)``."""
    stripped = _strip(markdown)
    spans = _BOLD.findall(stripped) + _SAVED_RUN.findall(stripped)
    return [n for span in spans for n in _PROSE_DECIMAL.findall(span)]


def prose_number_problems(notebook: dict) -> list[str]:
    """What in a notebook's markdown does not match its stored outputs (empty when all match)."""
    cells = notebook["cells"]
    every_output = _output_numbers("\n".join(_outputs(c) for c in cells if c["cell_type"] == "code"))
    problems = []
    since_markdown: list[dict] = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            since_markdown.append(cell)
            continue
        markdown = _text(cell)
        for number in dict.fromkeys(_quoted(markdown)):
            if not _found(number, every_output):
                problems.append(f"cell {index}: quoted {number} is in no stored output")
        is_reading = since_markdown and not re.search(r"^#", markdown, re.MULTILINE)
        if is_reading:
            local = _output_numbers("\n".join(_outputs(c) for c in since_markdown))
            for number in dict.fromkeys(_PROSE_DECIMAL.findall(_strip(markdown))):
                if not _found(number, local):
                    problems.append(f"cell {index}: {number} is not in the outputs of the code cells above it")
        since_markdown = []
    problems.extend(_run_time_problems(cells))
    return problems


def _run_time_problems(cells: list[dict]) -> list[str]:
    printed = [m for c in cells if c["cell_type"] == "code" for m in _RUN_TIME.findall(_outputs(c))]
    runtime_cells = [
        (i, _text(c)) for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "**Runtime.**" in _text(c)
    ]
    if not printed or not runtime_cells:
        return []
    problems = []
    run_time, unit = printed[-1]
    for index, markdown in runtime_cells:
        paragraph = _strip(markdown[markdown.index("**Runtime.**") :].split("\n\n")[0])
        stated = [n for pair in _DURATION[unit].findall(paragraph) for n in pair if n]
        if run_time not in stated:
            problems.append(
                f"cell {index}: the notebook printed its run time, {run_time} {unit}; "
                "its Runtime paragraph does not state it"
            )
        problems += [
            f"cell {index}: the Runtime paragraph says {n} {unit}, the printed run time is {run_time} {unit}"
            for n in stated
            if _as_float(n) != _as_float(run_time)
        ]
    return problems


def machine_paths(notebook: dict) -> list[str]:
    """Stored outputs that show a path of the machine that ran the notebook."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        for line in _outputs(cell).splitlines():
            if _MACHINE_PATH.search(line):
                found.append(f"cell {index}: {line.strip()[:160]}")
    return found


def test_readme_fits_in_ten_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}); move detail to docs/"


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name)
def test_tutorial_prose_matches_stored_outputs(path):
    problems = prose_number_problems(json.loads(path.read_text(encoding="utf-8")))
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name)
def test_stored_outputs_hold_no_machine_path(path):
    found = machine_paths(json.loads(path.read_text(encoding="utf-8")))
    assert not found, f"{path.name}:\n" + "\n".join(found)


def _cells(*cells: tuple[str, str, str]) -> dict:
    return {
        "cells": [
            {
                "cell_type": kind,
                "source": [text],
                **({"outputs": [{"output_type": "stream", "name": "stdout", "text": [out]}]} if kind == "code" else {}),
            }
            for kind, text, out in cells
        ]
    }


def test_the_check_catches_a_stale_reading_a_stale_quote_and_a_stale_run_time():
    stale = _cells(
        ("markdown", "**Runtime.** about 4–5 minutes on one thread.", ""),
        ("markdown", "## 1. Fit\n\n(the saved run: η = **2.93 rad**)", ""),
        (
            "code",
            "fit()",
            "η = 2.63 rad, elpd -8.83, exact -8.90\nnotebook run time: 0.8 min",
        ),
        (
            "markdown",
            "NUTS gives −8.4 and the exact LOO −8.6, all $\\hat k < 0.7$.",
            "",
        ),
    )
    problems = prose_number_problems(stale)
    assert any("quoted 2.93" in p for p in problems)
    assert any("−8.4" in p for p in problems) and any("−8.6" in p for p in problems)
    assert any("0.8 min" in p for p in problems)
    assert not any("0.7" in p and "run time" not in p for p in problems)  # math is not checked
    fixed = _cells(
        ("markdown", "**Runtime.** 0.8 min on one thread.", ""),
        ("markdown", "## 1. Fit\n\n(the saved run: η = **2.63 rad**)", ""),
        (
            "code",
            "fit()",
            "η = 2.63 rad, elpd -8.83, exact -8.90\nnotebook run time: 0.8 min",
        ),
        (
            "markdown",
            "NUTS gives −8.83 and the exact LOO −8.90, all $\\hat k < 0.7$.",
            "",
        ),
    )
    assert prose_number_problems(fixed) == []


def test_the_check_finds_a_machine_path():
    assert machine_paths(_cells(("code", "x", "warning in /home/someone/.venv/lib/site-packages/tqdm")))

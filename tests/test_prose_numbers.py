"""The prose says what the stored results say: README length, tutorial numbers, no machine paths, and
every path, command and name the pages give exists.

Fast (no notebook is executed, nothing is imported): the checks read ``README.md``, the stored outputs of
``tutorials/*.ipynb``, the pages a reader follows (``README.md``, ``ARCHITECTURE.md``, ``docs/*.md``,
``benchmarks/README.md``, ``research/**/*.md`` but result files) and the sources they name.

**What the pages name exists.** In code (inline or fenced) and links of those pages:

* a repository path (``benchmarks/…``, ``research/…``, ``tests/…``, ``tutorials/…``, ``docs/…``,
  ``pyro_invariance/…``, ``models/…``, ``guides/…``; in ``benchmarks/`` and ``research/`` pages also
  ``results/…`` beside the page; ``{a,b}`` expanded; ``<stem>``, ``*``, ``…`` are placeholders) and a
  relative link must exist;
* ``python -m pyro_invariance.X`` must name a module with a main block (or a package with ``__main__``),
  ``benchmarks/X.py --opt`` (and ``research/…/X.py``) a script that defines ``--opt`` (itself or in its
  ``_common.py`` / ``common.py``), ``--section Y`` a key of the script's ``SECTIONS``, ``make T`` a target;
* a dotted name given as a whole inline code span (``pi.fit``, ``pyro_invariance.infer.bounds``,
  ``research.uncertain_symmetry.evidence_profile.guide_evidence_profile``; a bare ``diagnostics.…`` is read
  in the package) must be a module, or a name its source defines.

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

import ast
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


# ------------------------------------------------------------------------------------------------
# Every path, command and name the prose gives exists
# ------------------------------------------------------------------------------------------------
# The pages a reader follows (result files are written by their scripts and checked with them).
PROSE_PAGES = [
    ROOT / "README.md",
    ROOT / "ARCHITECTURE.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(p for p in (ROOT / "research").rglob("*.md") if "results" not in p.relative_to(ROOT).parts),
]
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
_INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(
    r"(?<![\w./-])((?:benchmarks|research|tests|tutorials|docs|pyro_invariance|models|guides)/(?:[\w.+\-/<>*…$]|\{[^}\s]*\})*)"
)
_RELATIVE_RESULTS = re.compile(r"(?<![\w./-])(results/(?:[\w.+\-/<>*…$]|\{[^}\s]*\})*)")
_PLACEHOLDER = re.compile(r"[<>*…$]|\.\.\.")
_GENERATED = ("docs/_build",)  # written by `make docs`, not committed
# ``pyro_invariance.models`` and ``.guides`` are installed from the top-level folders (package-dir in pyproject.toml)
_SUBPACKAGES = {"models": ROOT / "models", "guides": ROOT / "guides"}
_MODULE_RUN = re.compile(r"(?<![\w.])-m\s+((?:pyro_invariance|research|benchmarks)(?:\.\w+)*)")
_SCRIPT_RUN = re.compile(r"(?<![\w./-])((?:benchmarks|research)/[\w/]+\.py)((?:[ \t]+(?:\\\n[ \t]*)?[^\s;&|#)`]+)*)")
_OPTION = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
_MAKE = re.compile(r"(?<![\w/.-])make ([a-z][\w-]*)")
_FILE_NAME = re.compile(r"\.(?:py|md|json|ipynb|png|sh|txt|toml)$")  # `distributions.py` is a file, not a name
_DOTTED = re.compile(r"((?:pi|pyro_invariance|research|diagnostics|infer|distributions)(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?")


def _expand(path: str) -> list[str]:
    """``a_run{1,2}/`` → ``a_run1/``, ``a_run2/`` (the shell's brace expansion, one level)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for alt in match.group(1).split(",") for p in _expand(path[: match.start()] + alt + path[match.end() :])]


def _code(text: str) -> list[str]:
    return [m.group() for m in _CODE.finditer(text)]


def named_paths(page: Path) -> list[tuple[str, Path]]:
    """(as written, where it points) for every repository path named in ``page``'s code and links."""
    text, named = page.read_text(encoding="utf-8"), []
    relative_results = page.parent != ROOT and page.parent.name != "docs"  # benchmarks/README, research/**
    for code in _code(text):
        found = [(p, ROOT / p) for p in _REPO_PATH.findall(code)]
        if relative_results:
            # a result file or folder beside the page; `--out results/x` is a git-ignored output, not one
            found += [(p, page.parent / p) for p in _RELATIVE_RESULTS.findall(code) if re.search(r"(/|\.\w+)$", p)]
        named += [(p, target) for p, target in found if not _PLACEHOLDER.search(p)]
    for link in _LINK.findall(text):
        target = link.split("#")[0]
        if target and not re.match(r"[a-z]+:", target) and not _PLACEHOLDER.search(target):
            named.append((link, page.parent / target))
    expanded = [(written, Path(p)) for written, target in named for p in _expand(str(target))]
    return [(w, t) for w, t in expanded if not any(t.resolve().is_relative_to(ROOT / g) for g in _GENERATED)]


def _runnable(module: str) -> bool:
    """``python -m module`` would run something: a package with ``__main__.py`` or a module with a main block."""
    parts = module.split(".")
    base = _SUBPACKAGES.get(parts[1]) if parts[0] == "pyro_invariance" and len(parts) > 1 else None
    path = base.joinpath(*parts[2:]) if base else ROOT.joinpath(*parts)
    if path.is_dir():
        return (path / "__main__.py").is_file()
    source = path.with_suffix(".py")
    return source.is_file() and '__name__ == "__main__"' in source.read_text(encoding="utf-8")


def _dict_keys(source: Path, name: str) -> set[str]:
    """The string keys of the module-level dict ``name`` in ``source`` (e.g. timing.py's ``SECTIONS``)."""
    node = _defined_names(ast.parse(source.read_text(encoding="utf-8")).body).get(name)
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
        return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return set()


def _script_problems(script: str, arguments: str) -> list[str]:
    """Options a command gives ``script`` that it does not define, and ``--section`` values it does not have."""
    path = ROOT / script
    if not path.is_file():
        return [f"{script} does not exist"]
    helpers = [p for d in (path.parent, path.parent.parent) for p in (d / "_common.py", d / "common.py") if p.is_file()]
    defined = "\n".join(p.read_text(encoding="utf-8") for p in [path, *helpers])
    problems = [f"{script} has no option {opt}" for opt in _OPTION.findall(arguments) if f'"{opt}"' not in defined]
    sections = _dict_keys(path, "SECTIONS")
    for value in re.findall(r"--section[ =]([^\s`]+)", arguments):
        # an upper-case value (NAME) is a placeholder
        unknown = [s for s in value.split(",") if s not in sections | {"all"} and not s.isupper()]
        problems += [f"{script} has no section {s!r} (it has {sorted(sections)})" for s in unknown]
    return problems


def named_command_problems(page: Path) -> list[str]:
    """Commands in ``page``'s code that name a module, script, option, section or make target that is not there."""
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))
    problems = []
    for code in _code(page.read_text(encoding="utf-8")):
        problems += [f"python -m {m}: no such runnable module" for m in _MODULE_RUN.findall(code) if not _runnable(m)]
        for script, arguments in _SCRIPT_RUN.findall(code):
            problems += _script_problems(script, arguments)
        problems += [f"make {t}: no such target" for t in _MAKE.findall(code) if t not in targets]
    return problems


def _defined_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body binds: definitions, assignments and imports (also under if / try)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update({n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, (ast.If, ast.Try)):
            names.update(_defined_names(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])))
    return names


def _package_dir(head: str) -> Path:
    return ROOT / ("research" if head == "research" else "pyro_invariance")


def resolves(dotted: str) -> bool:
    """``dotted`` (``pi.fit``, ``pyro_invariance.infer.bounds``, ``research.x.y.f``; a bare ``diagnostics.…``
    is read inside the package) names a module, or a name a module defines, read from the sources."""
    parts = dotted.split(".")
    if parts[0] in ("pi", "pyro_invariance", "research"):
        where, parts = _package_dir(parts[0]), parts[1:]
    else:
        where = ROOT / "pyro_invariance"
    for i, part in enumerate(parts):
        if where.is_dir():
            sub = (_SUBPACKAGES.get(part) if where.name == "pyro_invariance" else None) or where / part
            if (sub / "__init__.py").is_file() or sub.with_suffix(".py").is_file():
                where = sub if sub.is_dir() else sub.with_suffix(".py")
                continue
            where = where / "__init__.py"
        tree = ast.parse(where.read_text(encoding="utf-8"))
        names = _defined_names(tree.body)
        if part not in names:
            return "__getattr__" in names
        node, rest = names[part], parts[i + 1 :]
        # one level into a class: a method or class attribute
        return not rest or not isinstance(node, ast.ClassDef) or rest[0] in _defined_names(node.body)
    return True


def named_objects(page: Path) -> list[str]:
    """Dotted names given as a whole inline code span (``pi.fit``, ``research.uncertain_symmetry.…``)."""
    spans = _INLINE_CODE.findall(page.read_text(encoding="utf-8"))
    return [m.group(1) for span in spans if (m := _DOTTED.fullmatch(span)) and not _FILE_NAME.search(span)]


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_prose_names_exists(page):
    missing = sorted({written for written, target in named_paths(page) if not target.exists()})
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_the_prose_gives_runs_something_that_exists(page):
    problems = sorted(set(named_command_problems(page)))
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_name_the_prose_gives_exists(page):
    unknown = sorted({name for name in named_objects(page) if not resolves(name)})
    assert not unknown, f"{page.relative_to(ROOT)} names what the sources do not define: {unknown}"


def test_the_reference_checks_catch_a_moved_path_script_section_module_and_name(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Run `benchmarks/step_time.py`, `benchmarks/timing.py --section step,stepz --quick --nope`, "
        "`python -m pyro_invariance.data.toy2d` and `make no-such-target`; "
        "see [the old page](../reference_posteriors/) and `pyro_invariance/diagnostics/reference_posteriors/`; "
        "`diagnostics.symmetry_posterior.guide_evidence_profile`. Fine: `benchmarks/results/<stem>.md`, "
        "`benchmarks/timing.py --section ddp`, `python -m pyro_invariance.cli`, `pi.fit`, "
        "`pyro_invariance.infer.bounds`, `research.uncertain_symmetry.evidence_profile.guide_evidence_profile`.",
        encoding="utf-8",
    )
    missing = {written for written, target in named_paths(page) if not target.exists()}
    assert missing == {
        "benchmarks/step_time.py",
        "../reference_posteriors/",
        "pyro_invariance/diagnostics/reference_posteriors/",
    }
    problems = "\n".join(named_command_problems(page))
    for stale in ("step_time.py does not exist", "section 'stepz'", "no option --nope", "toy2d", "no-such-target"):
        assert stale in problems
    assert "no section 'step'" not in problems and "no section 'ddp'" not in problems and "--quick" not in problems
    unknown = {n for n in named_objects(page) if not resolves(n)}
    assert unknown == {"diagnostics.symmetry_posterior.guide_evidence_profile"}

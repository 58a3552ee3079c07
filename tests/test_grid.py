"""Grids of fits as array jobs (:mod:`pyro_invariance.infer.grid`): one result file per cell, named by
its settings (a grid can grow and keep its finished cells), no silent overwrite, separate processes
give the serial numbers, collect refuses missing and mislabelled cells, and the array index is read
from the scheduler's environment."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from pyro_invariance.infer.grid import (
    Grid,
    add_grid_arguments,
    array_spec,
    cell_index_from_env,
    run_grid_command,
)


def toy_cell(cell: dict) -> dict:
    """A cheap seeded "fit": a few steps of gradient descent from a random start (module level: the
    worker processes import it by name)."""
    if cell.get("fail"):
        raise RuntimeError(f"cell with seed {cell['seed']} fails on purpose")
    torch.set_num_threads(1)
    torch.manual_seed(cell["seed"])
    a = torch.randn(16, 16, dtype=torch.float64)
    w = torch.randn(16, dtype=torch.float64)
    for _ in range(20):
        w = w - cell["lr"] * (a.T @ (a @ w))
    return {"loss": float((a @ w).square().sum()), "w0": w[:3].tolist()}


def cells(n: int = 4, **extra) -> list[dict]:
    return [{"seed": i, "lr": 0.01, **extra} for i in range(n)]


def test_run_writes_one_file_per_cell_and_refuses_overwrite(tmp_path):
    grid = Grid(cells(3), toy_cell, tmp_path)
    assert grid.missing() == [0, 1, 2]
    first = grid.run(1)
    assert grid.path(1).parent == tmp_path / "cells" and grid.path(1).suffix == ".json"
    record = json.loads(grid.path(1).read_text())
    assert record["cell"] == {"seed": 1, "lr": 0.01} and record["result"] == first and record["index"] == 1
    assert grid.missing() == [0, 2]
    with pytest.raises(FileExistsError, match="cell 1 already has a result.*--overwrite"):
        grid.run(1)
    assert grid.run(1, overwrite=True) == first  # same cell, same numbers
    for bad in (3, -1, True, "1"):
        with pytest.raises(IndexError, match=r"out of range: this grid has cells 0-2"):
            grid.run(bad)
    assert not list((tmp_path / "cells").glob(".*.tmp"))  # atomic writes leave no temporary file


def test_cells_and_results_must_be_json(tmp_path):
    with pytest.raises(TypeError, match="JSON-serialisable"):
        Grid([{"x": object()}], toy_cell, tmp_path)
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        Grid([{"seed": 0}], _tensor_result, tmp_path).run(0)
    assert Grid([{"seed": 0}], _tensor_result, tmp_path).missing() == [0]  # nothing half-written


def _tensor_result(cell: dict) -> dict:
    return {"x": torch.zeros(2)}


def test_array_spec():
    assert array_spec([0, 1, 2, 3, 7, 9]) == "0-3,7,9"
    assert array_spec([9, 3, 2, 7, 1, 0]) == "0-3,7,9"
    assert array_spec([5]) == "5" and array_spec([]) == ""
    assert array_spec([0, 1, 2, 5, 6], base=1) == "1-3,6-7"


def test_run_missing_in_separate_processes_equals_serial_and_survives_a_failing_cell(tmp_path, capsys):
    # One pool round for everything (each worker process imports torch and pyro: seconds): cell 0 is
    # done before, cell 1 runs in its own process, cell 2 fails in its own.
    serial = [toy_cell(c) for c in cells(3)]
    failing = [*cells(2), {**cells(3)[2], "fail": True}]
    grid = Grid(failing, toy_cell, tmp_path, command="python toy.py")
    grid.run(0)
    before = grid.path(0).stat().st_mtime_ns
    with pytest.raises(RuntimeError, match=r"1 of 2 cells failed \(2\); the others are saved.*`python toy.py --jobs 2`"):
        grid.run_missing(jobs=2)
    assert "fails on purpose" in capsys.readouterr().err
    assert grid.missing() == [2]
    assert grid.path(0).stat().st_mtime_ns == before  # a finished cell is not rerun
    fixed = Grid(cells(3), toy_cell, tmp_path)
    fixed.run(2)
    assert fixed.missing() == [] and fixed.run_missing(jobs=2) == []
    assert fixed.collect() == serial  # bit-identical floats, through another process and JSON
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        fixed.run_missing(jobs=0)


def test_collect_lists_missing_cells_and_refuses_stale_results(tmp_path):
    grid = Grid(cells(), toy_cell, tmp_path, command="python toy.py")
    grid.run(0)
    grid.run(2)
    with pytest.raises(ValueError, match=r"2 of 4 cells have no result yet \(cells 1,3 in .*`python toy.py --jobs N`") as info:
        grid.collect()
    assert "\n" not in str(info.value) and "--array=1,3" in str(info.value)
    partial = grid.finished()  # what a table of a running (or stopped) grid shows
    assert sorted(partial) == [0, 2] and partial[2] == grid.run(2, overwrite=True)  # a seeded cell: the same result
    grid.run(1)
    grid.run(3)
    assert len(grid.collect()) == 4 and grid.finished() == dict(enumerate(grid.collect()))
    grid.path(1).write_text(grid.path(0).read_text())  # a file copied by hand: the settings inside differ
    with pytest.raises(ValueError, match=r"cell 1: .* other settings .*`python toy.py --cell 1 --overwrite`") as info:
        grid.collect()
    assert "\n" not in str(info.value)
    grid.path(1).write_text("{not json")
    with pytest.raises(ValueError, match="cell 1: cannot read"):
        grid.collect()


def test_a_grid_grows_and_reorders_without_losing_or_mixing_up_results(tmp_path):
    grid = Grid(cells(2), toy_cell, tmp_path)
    done = {c["seed"]: grid.run(i) for i, c in enumerate(grid.cells)}
    # More seeds, another learning rate, another order: the two finished cells are found by their settings.
    grown = Grid([*cells(4, lr=0.02), *reversed(cells(4))], toy_cell, tmp_path)
    assert grown.missing() == [0, 1, 2, 3, 4, 5]
    assert grown.finished() == {6: done[1], 7: done[0]}
    other = Grid(cells(2, lr=0.02), toy_cell, tmp_path)  # another grid in the same directory
    assert other.missing() == [0, 1]
    with pytest.raises(ValueError, match="grid cells 0 and 2 have the same settings"):
        Grid([*cells(2), cells(1)[0]], toy_cell, tmp_path)


@pytest.mark.parametrize(
    ("env", "index"),
    [
        ({}, None),
        ({"SLURM_ARRAY_TASK_ID": "0"}, 0),
        ({"SLURM_ARRAY_TASK_ID": " 7 "}, 7),
        ({"PBS_ARRAYID": "3"}, 3),
        ({"PBS_ARRAY_INDEX": "4"}, 4),
        ({"LSB_JOBINDEX": "1"}, 0),  # LSF is 1-based
        ({"LSB_JOBINDEX": "12"}, 11),
        ({"LSB_JOBINDEX": "0"}, None),  # LSF's value outside an array job
        ({"SGE_TASK_ID": "1"}, 0),  # SGE is 1-based
        ({"SGE_TASK_ID": "undefined"}, None),  # SGE's value outside an array job
        ({"SLURM_ARRAY_TASK_ID": "2", "SGE_TASK_ID": "9"}, 2),  # SLURM first
    ],
)
def test_cell_index_from_env(env, index):
    assert cell_index_from_env(env) == index


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_ARRAY_TASK_ID": "x"}, "SLURM_ARRAY_TASK_ID='x' is not an array index"),
        ({"SLURM_ARRAY_TASK_ID": "-1"}, "SLURM array indices start at 0"),
        ({"SGE_TASK_ID": "0"}, "SGE array indices start at 1"),
        ({"LSB_JOBINDEX": "1.5"}, "not an array index"),
    ],
)
def test_cell_index_from_env_refuses_bad_values(env, message):
    with pytest.raises(ValueError, match=message):
        cell_index_from_env(env)


def test_command_line_flags(tmp_path, monkeypatch, capsys):
    parser = add_grid_arguments(argparse.ArgumentParser(), default_dir=tmp_path / "default")
    grid = Grid(cells(3), toy_cell, tmp_path)
    assert run_grid_command(grid, parser.parse_args([])) is None  # no grid flag: the caller's serial loop
    assert run_grid_command(grid, parser.parse_args(["--cell", "2"])) is None
    run_grid_command(grid, parser.parse_args(["--missing"]))
    run_grid_command(grid, parser.parse_args(["--missing", "1"]))
    assert capsys.readouterr().out.split() == ["0-1", "1-2"]
    monkeypatch.setenv("SGE_TASK_ID", "1")
    run_grid_command(grid, parser.parse_args(["--cell"]))  # index from the environment: cell 0
    assert grid.missing() == [1]
    with pytest.raises(FileExistsError):
        run_grid_command(grid, parser.parse_args(["--cell"]))
    run_grid_command(grid, parser.parse_args(["--cell", "--overwrite"]))
    with pytest.raises(ValueError, match="--overwrite applies to --cell only"):
        run_grid_command(grid, parser.parse_args(["--collect", "--overwrite"]))
    with pytest.raises(SystemExit):  # one mode at a time
        parser.parse_args(["--collect", "--jobs", "2"])
    grid.run(1)
    assert run_grid_command(grid, parser.parse_args(["--collect"])) == [toy_cell(c) for c in cells(3)]
    assert parser.parse_args([]).grid_dir == tmp_path / "default"

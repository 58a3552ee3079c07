"""``threads``: one FitConfig setting, one option for ``fit``, ``compare`` and ``demo``; torch's count is set
for a call and restored after it."""

from __future__ import annotations

import pytest
import torch
from small_runs import small_digits, small_fit

from pyro_invariance import cli
from pyro_invariance.infer.checkpoint import CheckpointError
from pyro_invariance.infer.config import FitConfig
from pyro_invariance.infer.training import fingerprint_settings


@pytest.mark.parametrize(
    "command",
    [
        ["fit", "--model", "invariant-mlp", "--data", "digits"],
        ["compare", "--model", "invariant-mlp", "--data", "digits"],
        ["demo"],
    ],
)
def test_every_command_takes_threads(command):
    args = cli.build_parser().parse_args([*command, "--threads", "2"])
    assert args.threads == 2


def test_demo_defaults_to_one_thread():
    assert cli.build_parser().parse_args(["demo"]).threads == 1


@pytest.mark.parametrize("bad", [0, -1, "2", 1.5, True])
def test_bad_thread_counts_are_refused(bad):
    with pytest.raises(ValueError, match="threads must be an integer >= 1"):
        FitConfig(threads=bad).validate()


def test_cli_refuses_zero_threads_in_one_line(capsys, tmp_path):
    code = cli.main(
        ["fit", "--model", "invariant-mlp", "--data", "digits", "--threads", "0", "--out", str(tmp_path / "r")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "threads must be an integer >= 1, got 0" in err[0]


def test_fit_sets_the_count_for_the_call_and_restores_it():
    seen: list[int] = []
    before = torch.get_num_threads()
    small_fit(small_digits(), steps=2, threads=2, callbacks=[lambda *_: seen.append(torch.get_num_threads())])
    assert seen == [2, 2] and torch.get_num_threads() == before


def test_a_given_count_is_part_of_the_fingerprint_and_none_is_not():
    assert "threads" not in fingerprint_settings(FitConfig())
    assert fingerprint_settings(FitConfig(threads=1))["threads"] == 1


def test_resume_with_another_thread_count_is_refused(tmp_path):
    data, path = small_digits(), tmp_path / "run.pt"
    small_fit(data, steps=4, until_step=2, checkpoint_path=path, threads=1)
    with pytest.raises(CheckpointError, match="threads"):
        small_fit(data, steps=4, checkpoint_path=path, resume=True, threads=2)

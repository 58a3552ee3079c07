"""Paper 003's Fig. 1 command (``benchmarks/toy2d_figure.py``) at its quick size: the figure and the table."""

from __future__ import annotations

import pytest
import toy2d_figure


@pytest.mark.slow
def test_figure_command(tmp_path):
    assert toy2d_figure.main(["--out", str(tmp_path), "--quick", "--learned"]) == 0
    assert (tmp_path / "extrapolation.png").is_file() and (tmp_path / "results.json").is_file()

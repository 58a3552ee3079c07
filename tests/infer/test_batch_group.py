"""``batch_group``: minibatches of whole groups of consecutive rows (e.g. the pairs of one trajectory)."""

import pytest
import torch

import pyro_invariance as pi
from pyro_invariance.data import load_dataset
from pyro_invariance.infer import step_loop, training


def test_minibatches_hold_whole_groups_each_group_once_per_epoch():
    batches = step_loop.Batches(60, 20, seed=3, group=5)
    for _epoch in range(2):
        seen = []
        for _ in range(3):
            idx = batches.next().reshape(-1, 5)
            assert (idx == idx[:, :1] + torch.arange(5)).all() and (idx[:, 0] % 5 == 0).all()  # whole groups
            seen += idx[:, 0].tolist()
        assert sorted(seen) == list(range(0, 60, 5))  # every group once per pass


def test_without_groups_the_draws_are_the_rows_of_before():
    a, b = step_loop.Batches(60, 20, seed=3), step_loop.Batches(60, 20, seed=3, group=None)
    expected = torch.randperm(60, generator=torch.Generator().manual_seed(3 + 7919))
    assert torch.equal(a.next(), expected[:20]) and torch.equal(b.next(), expected[:20])


def test_a_group_that_does_not_divide_is_refused_in_one_line():
    with pytest.raises(ValueError, match="batch_size=20 is not a multiple of batch_group=3"):
        pi.FitConfig(batch_size=20, batch_group=3).validate()
    with pytest.raises(ValueError, match="batch_group=7 must divide the 60 rows"):
        step_loop.Batches(60, 14, seed=0, group=7)


def test_batch_group_is_in_the_fingerprint_only_when_set():
    assert "batch_group" not in training.fingerprint_settings(pi.FitConfig())
    assert training.fingerprint_settings(pi.FitConfig(batch_group=5))["batch_group"] == 5


def test_a_grouped_run_resumes_bit_for_bit(tmp_path):
    data = load_dataset("basis-toy")
    runs = []
    for resume in (False, True):
        model = pi.models.get("basis-regression")
        guide = pi.guides.get("mean-field", model)
        kw = dict(
            steps=12, batch_size=8, batch_group=4, seed=1, progress=False, checkpoint_path=tmp_path / f"{resume}.pt"
        )
        if resume:
            pi.fit(model, guide, data, until_step=5, **kw)
            model = pi.models.get("basis-regression")
            guide = pi.guides.get("mean-field", model)
            runs.append(pi.fit(model, guide, data, resume=True, **kw))
        else:
            runs.append(pi.fit(model, guide, data, **kw))
    assert runs[0].history["elbo"] == runs[1].history["elbo"]

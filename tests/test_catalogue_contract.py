"""The catalogue contract (models/base.py, pyro_invariance/tasks.py).

Every registered model is a ``CatalogueModel`` with a task; its ``symmetry_parameters()`` are exactly
the parameter objects ``pi.fit`` trains with ``eta_lr``; its likelihood is scaled by N/B in the
plate "data"; every model can be fitted and evaluated from the CLI on a registered dataset and prints
its task's metric columns; the library asks the protocol and the tasks instead of probing models
with ``getattr`` or switching on the kind of task. Sizes are tiny: the file runs in well under a
minute on one core.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from pyro import poutine

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.catalogue import model_kwargs_for
from pyro_invariance.cli import main
from pyro_invariance.infer import step_loop, training
from pyro_invariance.models.base import PRIORS, CatalogueModel
from pyro_invariance.tasks import TASKS, Task

torch.set_num_threads(1)

#: Per registered model: a registered dataset and tiny model arguments (``--model-arg``). A new
#: catalogue model needs an entry here (test_every_model_has_an_example).
EXAMPLES: dict[str, tuple[str, dict]] = {
    "basis-regression": ("basis-toy", {"num_features": 6}),
    "invariant-mlp": ("rotated-digits", {"hidden": 8, "num_transforms": 2}),
    "rotation-toy-2d": ("rotation-toy-2d", {"hidden": 4, "num_transforms": 2}),
    "symmetrised-hnn": ("sho", {"hidden": [4], "num_transforms": 2, "euler_steps": 1}),
    **{name: ("rotated-digits", {"alpha": 1}) for name in pi.MODELS.names() if name.startswith("layerwise-")},
}
#: Dataset sizes of every example (physics data: no disk cache).
DATA_KWARGS: dict[str, dict] = {"sho": {"cache_dir": False}}
SIZES = {"train_size": 16, "test_size": 8}

NAMES = pi.MODELS.names()


def test_every_model_has_an_example():
    assert sorted(EXAMPLES) == NAMES


@functools.cache
def _dataset(name: str):
    return pi.DATASETS.get(name, **SIZES, **DATA_KWARGS.get(name, {}))


def _built(name: str, guide: str = "mean-field", **model_kwargs):
    """``(dataset, model, guide)`` of the example, the model sized for the dataset."""
    data_name, kwargs = EXAMPLES[name]
    data = _dataset(data_name)
    model = pi.MODELS.get(name, **model_kwargs_for(name, data, **kwargs, **model_kwargs))
    return data, model, guides.get(guide, model)


# ------------------------------------------------------------------------------------------------
# the protocol


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_model_is_a_catalogue_model(name):
    model = pi.MODELS.get(name)
    assert isinstance(model, CatalogueModel)
    assert isinstance(type(model).task, Task) and model.task in TASKS.values()
    assert isinstance(type(model).fit_defaults, Mapping)
    assert set(type(model).priors) <= set(PRIORS) and model.prior in type(model).priors
    assert isinstance(model.guide_defaults("mean-field"), dict) and isinstance(model.arviz_dims(), dict)
    assert all(isinstance(p, torch.nn.Parameter) for p in model.symmetry_parameters())
    assert all(isinstance(v, torch.Tensor) for v in model.symmetry_summary().values())


def test_the_protocol_is_abstract():
    with pytest.raises(TypeError, match="abstract"):
        CatalogueModel()


@pytest.mark.parametrize("name", NAMES)
def test_symmetry_parameters_are_the_eta_group_of_fit(name, monkeypatch):
    """``pi.fit`` gives ``eta_lr`` to exactly the objects ``model.symmetry_parameters()`` returns
    (by identity), to nothing else, and every task evaluates a plain ``(x, y)`` pair."""
    data, model, guide = _built(name)
    groups = []

    class Recording(torch.optim.Adam):
        def __init__(self, params, *args, **kwargs):
            groups.extend(params)
            super().__init__(params, *args, **kwargs)

    monkeypatch.setattr(training.torch.optim, "Adam", Recording)
    result = pi.fit(model, guide, data, steps=1, batch_size=8, progress=False)
    declared = model.symmetry_parameters()
    assert declared, f"{name}: learns its symmetry by default"
    eta = next(g for g in groups if g["name"] == "eta")
    assert len(eta["params"]) == len(declared) and all(a is b for a, b in zip(eta["params"], declared))
    others = [p for g in groups if g["name"] != "eta" for p in g["params"]]
    assert not any(p is q for p in others for q in declared)
    assert set(result.eta) == set(model.symmetry_summary())
    x, y = pi.data.train_arrays(data)
    metrics = pi.evaluate(result, (x, y), num_samples=1)
    assert model.task.table_columns(metrics) and model.task.columns[0].key in metrics


def test_fixed_symmetry_has_no_eta_group():
    _, model, guide = _built("invariant-mlp", learn_symmetry=False)
    assert model.symmetry_parameters() == []
    groups = step_loop.param_groups(model, guide, pi.FitConfig())
    assert "eta" not in {g["name"] for g in groups}


@pytest.mark.parametrize("name", NAMES)
def test_likelihood_is_scaled_by_n_over_b(name):
    """``CatalogueModel.observe``: the plate "data" of size N subsampled to B rows scales by N/B."""
    data, model, _ = _built(name)
    x, y = pi.data.train_arrays(data, model)
    trace = poutine.trace(model).get_trace(x[:4], y[:4], num_data=12)
    assert trace.nodes["obs"]["scale"] == pytest.approx(3.0)
    assert trace.nodes["data"]["value"].tolist() == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------------
# the CLI: fit then evaluate every registered model


@pytest.mark.parametrize("name", NAMES)
def test_cli_fits_and_evaluates_every_model(name, tmp_path, capsys):
    data_name, kwargs = EXAMPLES[name]
    task = _built(name)[1].task
    args = [
        "fit",
        "--model",
        name,
        "--guide",
        "mean-field",
        "--data",
        data_name,
        "--steps",
        "2",
        "--batch-size",
        "8",
        "--train-size",
        str(SIZES["train_size"]),
        "--test-size",
        str(SIZES["test_size"]),
        "--no-progress",
        "--eval-samples",
        "1",
        "--out",
        str(tmp_path),
    ]
    for key, value in kwargs.items():
        args += ["--model-arg", f"{key}={value}".replace(" ", "")]
    for key, value in DATA_KWARGS.get(data_name, {}).items():
        args += ["--data-arg", f"{key}={str(value).lower()}"]
    assert main(args) == 0, capsys.readouterr().err
    fitted = capsys.readouterr().out
    assert main(["evaluate", "--run", str(tmp_path), "--eval-samples", "1"]) == 0, capsys.readouterr().err
    evaluated = capsys.readouterr().out
    titles = [c.title for c in task.columns if c.key != "energy_drift" or data_name == "sho"]
    for out in (fitted, evaluated):
        header = out.splitlines()[0]
        assert all(title in header for title in titles), (titles, header)
    assert (tmp_path / "evaluation.json").exists()


# ------------------------------------------------------------------------------------------------
# no probing, no switches

PROTOCOL = (
    "symmetry_parameters",
    "symmetry_summary",
    "symmetry_param_names",
    "fit_defaults",
    "guide_defaults",
    "arviz_dims",
    "arviz_coords",
    "prepare_inputs",
    "input_shapes",
    "target_shapes",
    "task",
    "log_evidence",
    "figures",
    "filter_bank",
    "observe",
)
PROBE = re.compile(r"\b(?:getattr|hasattr)\([^()]*?,\s*[\"'](" + "|".join(PROTOCOL) + r")[\"']")
_KINDS = r"[\"'](?:classification|regression|dynamics)[\"']"
SWITCH = re.compile(rf"(?:==|!=)\s*{_KINDS}|{_KINDS}\s*(?:==|!=|if\b)")


def _library_sources() -> list[Path]:
    roots = {Path(pi.__file__).parent, Path(pi.models.__file__).parent, Path(pi.guides.__file__).parent}
    return sorted(p for root in roots for p in root.rglob("*.py"))


def test_no_getattr_probing_for_protocol_members_and_no_task_switches():
    sources = _library_sources()
    assert any(p.name == "base.py" and p.parent.name == "models" for p in sources)
    probes = [f"{p}:{i}" for p in sources for i, line in enumerate(p.read_text().splitlines(), 1) if PROBE.search(line)]
    switches = [
        f"{p}:{i}" for p in sources for i, line in enumerate(p.read_text().splitlines(), 1) if SWITCH.search(line)
    ]
    assert not probes, probes
    assert not switches, switches


@pytest.mark.parametrize("name", pi.DATASETS.names())
def test_every_dataset_declares_its_kind_when_it_registers(name):
    """A dataset's task and row type come with its registration, so no table elsewhere lists modules."""
    task, rows = pi.DATASETS.entry(name).info["kind"]
    assert task in {"classification", "regression", "dynamics"} and rows in {"images", "vectors"}

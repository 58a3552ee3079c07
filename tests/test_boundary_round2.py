"""Arguments checked at the boundary, round two: devices, seeds, numbers given as text, per-generator
mappings, misspelt keywords, models on data they cannot take, ``to_inference_data``'s data and
numerically hopeless inputs. Every bad input gets one line naming the argument, what was given and
what is allowed, before any step runs; nothing trains silently."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from small_runs import small_digits, small_model

import pyro_invariance as pi
from pyro_invariance import guides, validation
from pyro_invariance.catalogue import build
from pyro_invariance.cli import main
from pyro_invariance.diagnostics.inference_data import to_inference_data
from pyro_invariance.infer import training
from pyro_invariance.infer.config import FitConfig

torch.set_num_threads(1)

#: Devices no machine has: an unknown name, torch's placeholder device, a CUDA index past the last.
MISSING_DEVICES = ["gpu", "meta", f"cuda:{torch.cuda.device_count()}", "cuda:x"]
SEED_MAX = 2**32 - 1  # numpy's largest seed, the package's bound for every seed
BAD_SEEDS = [-1, SEED_MAX + 1, 2**70]


@pytest.fixture(scope="module")
def data():
    return small_digits()


@pytest.fixture(scope="module")
def fitted(data):
    model = small_model()
    return pi.fit(model, guides.get("mean-field", model), data, steps=2, batch_size=64, progress=False)


def _fit(data, **kw):
    model = small_model()
    return pi.fit(model, guides.get("mean-field", model), data, steps=2, batch_size=64, progress=False, **kw)


def _no_fit(*args, **kwargs):
    raise AssertionError("fit was called: the argument should have been refused before any fitting")


# ------------------------------------------------------------------------------------------------ devices


@pytest.mark.parametrize("device", MISSING_DEVICES)
@pytest.mark.parametrize("entry", ["FitConfig", "fit", "evaluate", "compare_guides"])
def test_a_device_this_machine_lacks_is_refused_in_one_line_at_every_entry(entry, device, data, fitted, monkeypatch):
    monkeypatch.setattr(training, "fit", _no_fit)  # compare_guides: refused before the first fit
    calls = {
        "FitConfig": lambda: FitConfig(device=device).validate(),
        "fit": lambda: pi.fit(fitted.model, fitted.guide, data, steps=1, progress=False, device=device),
        "evaluate": lambda: pi.evaluate(fitted, data, num_samples=2, device=device),
        "compare_guides": lambda: pi.compare_guides(
            "invariant-mlp",
            data,
            ["mean-field"],
            steps=1,
            device=device,
            model_kwargs={"hidden": 4, "num_transforms": 2},
        ),
    }
    with pytest.raises(ValueError, match=rf"^device must be one of 'cpu'.* on this machine, got '{device}'") as info:
        calls[entry]()
    assert isinstance(info.value, RuntimeError)  # what fit raised for a missing GPU before
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("entry", ["fit", "evaluate"])
def test_cuda_without_cuda_is_refused_by_evaluate_as_by_fit(entry, data, fitted, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same path on a machine with a GPU
    with pytest.raises(ValueError, match=r"got 'cuda' \(torch.cuda.is_available\(\) is False here\)"):
        if entry == "fit":
            pi.fit(fitted.model, fitted.guide, data, steps=1, progress=False, device="cuda")
        else:
            pi.evaluate(fitted, data, num_samples=2, device="cuda")


def test_check_device_accepts_what_this_machine_has():
    check = validation.check_device
    assert check("cpu") == "cpu" and check(torch.device("cpu")) == "cpu"
    if torch.cuda.is_available():
        assert check("cuda") == "cuda" and check(torch.device("cuda", 0)) == "cuda:0"


# ------------------------------------------------------------------------------------------------ seeds


@pytest.mark.parametrize("seed", BAD_SEEDS)
@pytest.mark.parametrize("entry", ["check_seed", "FitConfig", "fit", "evaluate", "to_inference_data"])
def test_seeds_outside_0_to_2_pow_32_are_refused_at_every_entry(entry, seed, data, fitted):
    calls = {
        "check_seed": lambda: validation.check_seed(seed),
        "FitConfig": lambda: FitConfig(seed=seed).validate(),
        "fit": lambda: _fit(data, seed=seed),
        "evaluate": lambda: pi.evaluate(fitted, data, num_samples=2, seed=seed),
        "to_inference_data": lambda: to_inference_data(fitted, data, num_samples=2, seed=seed),
    }
    with pytest.raises(ValueError, match=rf"^seed must be an integer in 0…{SEED_MAX} \(2\*\*32 - 1\), got {seed}$"):
        calls[entry]()


@pytest.mark.parametrize("name", pi.MODELS.names())
def test_init_seed_outside_the_range_is_refused_by_every_model(name):
    with pytest.raises(ValueError, match=r"^init_seed must be an integer in 0…"):
        pi.MODELS.get(name, init_seed=2**70)


@pytest.mark.parametrize(
    "argv",
    [
        ["fit", "--model", "invariant-mlp", "--data", "digits", "--seed", "-1"],
        ["evaluate", "--run", "/nonexistent/run", "--seed", "-1"],
    ],
)
def test_cli_refuses_a_negative_seed_naming_it(argv, tmp_path, capsys):
    extra = ["--out", str(tmp_path / "o"), "--no-progress"] if argv[0] == "fit" else []
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert "seed must be an integer in 0…4294967295" in err and err.count("\n") == 1


def test_the_largest_seed_runs_compare_guides_end_to_end(monkeypatch):
    """compare_guides derives seeds seed + 1, seed + 2: from the largest seed they wrap, not overflow numpy."""
    cmp = pi.compare_guides(
        "basis-regression",
        "basis-toy",
        ["mean-field"],
        steps=2,
        K=2,
        eval_samples=2,
        seed=SEED_MAX,
        data_kwargs={"train_size": 8, "test_size": 4},
        model_kwargs={"num_features": 4},
    )
    assert cmp.settings["seed"] == SEED_MAX and len(cmp.rows) == 1


# ------------------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize("field", ["lr", "eta_lr", "model_lr", "factor_lr"])
def test_a_rate_given_as_text_is_refused_before_step_1(field, data):
    with pytest.raises(ValueError, match=rf"^{field} must be a positive number, got the str '0.1'$"):
        FitConfig(**{field: "0.1"}).validate()
    with pytest.raises(ValueError, match=rf"^{field} must be a positive number, got the str '0.1'$"):
        _fit(data, **{field: "0.1"})


# ------------------------------------------------------------------------------------------------ model arguments


@pytest.mark.parametrize("symmetry", [None, 3, [1, 2]])
def test_a_symmetry_that_is_not_a_name_is_refused_naming_symmetry(symmetry):
    with pytest.raises(ValueError, match=r"^symmetry must be a subgroup name .*'none' for no symmetry.*got"):
        small_model(symmetry=symmetry)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"eta_max": {"foo": 1.0}},
            r"^eta_max names \['foo'\], which are not in the subgroup \['rot'\] of the model's symmetry",
        ),
        ({"eta_max": {"tx": 0.5}}, r"^eta_max names \['tx'\]"),  # a generator, but not of this subgroup
        ({"eta_max": {"rot": -1.0}}, r"^eta_max\['rot'\] must be a positive number .*got -1.0$"),
        ({"eta_max": {"rot": "pi"}}, r"^eta_max\['rot'\] must be a finite number, got 'pi'$"),
        ({"eta_max": [1.0]}, r"^eta_max must be a mapping generator -> number"),
        ({"eta_max": {"rot": 0.05}}, r"^eta_init \{'rot': 0.1\} outside \[0, eta_max\] with eta_max \{'rot': 0.05\}$"),
    ],
)
def test_every_per_generator_mapping_refuses_unknown_names_and_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_model(**kwargs)


def test_eta_max_with_an_unknown_name_is_refused_and_with_known_names_sets_the_bound():
    with pytest.raises(ValueError, match=r"^eta_max names \['foo'\]"):
        small_model(symmetry="tx+rot", eta_max={"rot": 2.0, "foo": 1.0})
    model = small_model(symmetry="tx+rot", eta_max={"rot": 2.0}, eta_init={"rot": 1.0})
    assert model.eta_upper.tolist() == pytest.approx([1.0, 2.0])


@pytest.mark.parametrize(
    "build_it, message",
    [
        (
            lambda: pi.MODELS.get("invariant-mlp", hidden_size=8),
            r"^model 'invariant-mlp' takes no argument 'hidden_size' \(did you mean 'hidden'\?\); "
            r"its arguments: image_shape, num_classes, hidden, .*init_seed, symmetry_prior$",
        ),
        (
            lambda: pi.MODELS.get("layerwise-fc", alpah=1),
            r"^model 'layerwise-fc' takes no argument 'alpah' \(did you mean 'alpha'\?\); "
            r"its arguments: .*alpha.*init_seed",
        ),
        (
            lambda: guides.get("mean-field", small_model(), init_scal=0.1),
            r"^guide 'mean-field' takes no argument 'init_scal' \(did you mean 'init_scale'\?\); "
            r"its arguments: init_loc_fn, init_scale$",
        ),
        (
            lambda: guides.get("map", small_model(), init_scale=0.1),
            r"^guide 'map' takes no argument 'init_scale'; its arguments: init_loc_fn$",
        ),
    ],
)
def test_a_misspelt_keyword_lists_the_valid_ones_in_one_line(build_it, message):
    with pytest.raises(TypeError, match=message):
        build_it()


def test_compare_guides_refuses_a_misspelt_guide_keyword_before_fitting_any_guide(data, monkeypatch):
    monkeypatch.setattr(training, "fit", _no_fit)
    with pytest.raises(TypeError, match=r"^guide 'map' takes no argument 'init_scale'"):
        pi.compare_guides(
            "invariant-mlp",
            data,
            ["mean-field", "map"],
            steps=1,
            guide_kwargs={"map": {"init_scale": 0.1}},
            model_kwargs={"hidden": 4, "num_transforms": 2},
        )


@pytest.mark.parametrize(
    "model, dataset, fits",
    [
        (
            "symmetrised-hnn",
            "rotated-digits",
            "a dynamics model on vectors; datasets that fit: kepler, nbody, nbody-3, oscillators, oscillators-3, sho",
        ),
        (
            "basis-regression",
            "rotated-digits",
            "basis-regression is a regression model on vectors; datasets that fit: basis-toy",
        ),
        (
            "invariant-mlp",
            "basis-toy",
            "invariant-mlp is a classification model on images; datasets that fit: cifar10, digits",
        ),
    ],
    ids=["hnn-on-images", "regression-on-images", "images-model-on-regression"],
)
def test_a_model_on_data_it_cannot_take_names_the_datasets_that_fit(
    model, dataset, fits, tmp_path, capsys, monkeypatch
):
    spec = {"model": model, "guide": "mean-field", "data": dataset, "data_kwargs": {"train_size": 8, "test_size": 4}}
    with pytest.raises(ValueError, match=rf"^model '{model}' does not fit dataset '{dataset}' \(x must have shape"):
        build(spec)
    code = main(
        [
            "fit",
            "--model",
            model,
            "--data",
            dataset,
            "--train-size",
            "8",
            "--test-size",
            "4",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and fits in err and err.count("\n") == 1
    monkeypatch.setattr(training, "fit", _no_fit)
    with pytest.raises(ValueError, match=fits.replace("(", r"\(")):
        pi.compare_guides(model, dataset, ["mean-field"], steps=1, data_kwargs={"train_size": 8, "test_size": 4})


# ------------------------------------------------------------------------------------------------ CLI hints


@pytest.mark.parametrize("command", ["compare", "demo"])
def test_refusing_an_existing_out_suggests_only_options_the_command_has(command, tmp_path, capsys):
    if command == "compare":
        (tmp_path / "table.md").write_text("an earlier table")
        argv = [
            "compare",
            "--model",
            "invariant-mlp",
            "--data",
            "digits",
            "--guides",
            "mean-field",
            "--out",
            str(tmp_path),
        ]
    else:
        (tmp_path / "learned-rotation").mkdir()
        (tmp_path / "learned-rotation" / "result.json").write_text("{}")
        argv = ["demo", "--steps", "1", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "--overwrite" in err and "--resume" not in err


# ------------------------------------------------------------------------------------------------ to_inference_data


def test_to_inference_data_converts_inputs_as_fit_does(data, fitted):
    as_float32 = to_inference_data(fitted, data, num_samples=2)
    as_numpy64 = to_inference_data(
        fitted, (data.x_train.numpy().astype(np.float64), data.y_train.numpy()), num_samples=2
    )
    for group in ("log_likelihood", "posterior_predictive"):
        np.testing.assert_array_equal(np.asarray(as_numpy64[group]["obs"]), np.asarray(as_float32[group]["obs"]))


def test_to_inference_data_refuses_labels_out_of_range_in_one_line(data, fitted):
    with pytest.raises(ValueError, match=r"^y has labels in \[20, 29\] .*must lie in \[0, 10\)"):
        to_inference_data(fitted, (data.x_train, data.y_train + 20), num_samples=2)


# ------------------------------------------------------------------------------------------------ hopeless inputs


@pytest.mark.parametrize("scale", [1e20, 1e30])
def test_inputs_whose_squares_overflow_are_refused_with_the_reason(scale, data):
    with pytest.raises(ValueError, match=r"^x holds values up to .* their squares overflow torch.float32.*rescale x"):
        _fit((data.x_train * scale, data.y_train))


def test_first_gradients_that_overflow_the_optimiser_state_stop_the_run_at_step_1_naming_the_parameter(data):
    """Inputs below the boundary's bound whose first gradients (N/B times larger) still overflow Adam's
    second moment: refused after the first step instead of freezing the parameter silently."""
    model = small_model(activation="relu")
    x = torch.cat([data.x_train] * 4) * 5e18  # 1024 rows: the likelihood's gradient is scaled by N/B = 16
    with pytest.raises(
        FloatingPointError,
        match=r"^at step 1, the first of this call: the optimiser state 'exp_avg_sq' "
        r"of (model|guide) parameter '.*' overflowed to inf",
    ):
        pi.fit(
            model,
            guides.get("mean-field", model),
            (x, torch.cat([data.y_train] * 4)),
            steps=3,
            batch_size=64,
            progress=False,
        )


def test_an_optimiser_state_that_overflows_later_is_reported_when_fit_returns(data):
    """The first steps are fine, a later one overflows Adam's second moment while the loss stays finite:
    the result comes back with a warning that names the parameter that stopped learning."""
    model = small_model(activation="relu")
    match = r"^after step 8: the optimiser state 'exp_avg_sq' of .* overflowed to inf"
    with pytest.warns(RuntimeWarning, match=match) as caught:
        pi.fit(
            model,
            guides.get("mean-field", model),
            (data.x_train * 2e18, data.y_train),
            steps=8,
            batch_size=64,
            progress=False,
        )
    assert [w.filename for w in caught if "overflowed" in str(w.message)] == [__file__]  # points at the user's call

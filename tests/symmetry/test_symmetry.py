"""Affine generators, transform sampling and warping (paper 003, Section 3.3; docs/methods.md §1)."""

import math

import pytest
import torch
import torchvision.transforms.functional as TF

from pyro_invariance.symmetry.affine import (
    DEFAULT_ETA_MAX,
    GENERATOR_NAMES,
    affine_det,
    affine_generators,
    eta_to_human,
    generator_indices,
    invert_affine,
    lie_exp,
    resolve_subgroup,
    sample_epsilon,
    transform_images,
    transform_weight_rows,
    warp_stack,
)

torch.set_num_threads(1)


def _smooth_image(size=28, seed=0):
    """A smooth blob image (interpolation error stays small), zero near the border."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    img = torch.zeros(size, size)
    for _ in range(4):
        cx, cy = (torch.rand(2, generator=g) - 0.5) * 0.8
        img += torch.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / 0.05)
    return (img * (xs**2 + ys**2 < 0.8).float()).reshape(1, 1, size, size)


def test_generators_match_methods_note():
    g = affine_generators(dtype=torch.float64)
    assert g.shape == (6, 3, 3) and GENERATOR_NAMES == ("tx", "ty", "rot", "sx", "sy", "shear")
    expected = torch.zeros(6, 3, 3, dtype=torch.float64)
    expected[0, 0, 2] = expected[1, 1, 2] = 1
    expected[2, 0, 1], expected[2, 1, 0] = -1, 1
    expected[3, 0, 0] = expected[4, 1, 1] = 1
    expected[5, 0, 1] = expected[5, 1, 0] = 1
    assert torch.equal(g, expected)


@pytest.mark.parametrize("theta", [0.3, -1.2, math.pi / 2, 3.0])
def test_expm_of_rotation_generator_is_rotation(theta):
    g = affine_generators(dtype=torch.float64)[2]
    t = torch.linalg.matrix_exp(theta * g)
    c, s = math.cos(theta), math.sin(theta)
    expected = torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=torch.float64)
    assert torch.allclose(t, expected, atol=1e-12)


def test_translation_and_scale_closed_forms():
    g = affine_generators(dtype=torch.float64)
    eps = torch.tensor([[0.5, -0.25, 0.0, 0.3, -0.2, 0.0]], dtype=torch.float64)
    t = lie_exp(torch.ones(6, dtype=torch.float64), eps, g)[0]
    expected = torch.tensor(
        [
            [math.exp(0.3), 0, 0.5 * (math.exp(0.3) - 1) / 0.3],
            [0, math.exp(-0.2), -0.25 * (math.exp(-0.2) - 1) / -0.2],
            [0, 0, 1],
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(t, expected, atol=1e-12)


def test_eta_zero_is_identity():
    eps = sample_epsilon(10, 6, generator=torch.Generator().manual_seed(0))
    t = lie_exp(torch.zeros(6), eps, affine_generators())
    assert torch.allclose(t, torch.eye(3).expand(10, 3, 3), atol=1e-7)
    img = _smooth_image()
    assert torch.allclose(transform_images(img, t[:1]), img, atol=1e-6)


@pytest.mark.parametrize("degrees", [30.0, -75.0, 90.0, 180.0])
def test_rotation_agrees_with_torchvision(degrees):
    img = _smooth_image()
    theta = math.radians(degrees)
    t = torch.linalg.matrix_exp(theta * affine_generators()[2])
    ours = transform_images(img, t)
    reference = TF.rotate(img, degrees, interpolation=TF.InterpolationMode.BILINEAR)
    err = (ours - reference).abs().max()
    assert err < 1e-3 * img.max(), f"max abs difference {err:.4f}"
    # and rotations by 90° map the pixel grid onto itself exactly
    if degrees == 90.0:
        assert torch.allclose(ours, torch.rot90(img, k=1, dims=(2, 3)), atol=1e-5)


def test_translation_agrees_with_torchvision_affine():
    img = _smooth_image()
    size = img.shape[-1]
    shift_px = 4.0
    eta_tx = shift_px / ((size - 1) / 2)  # normalised units: 1 = half the side
    t = torch.linalg.matrix_exp(eta_tx * affine_generators()[0])
    ours = transform_images(img, t)
    reference = TF.affine(
        img,
        angle=0.0,
        translate=[-int(shift_px), 0],
        scale=1.0,
        shear=[0.0, 0.0],
        interpolation=TF.InterpolationMode.BILINEAR,
    )
    assert (ours - reference).abs().max() < 1e-4


def test_weight_rows_transform_like_images():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(5, 2 * 6 * 6, generator=g)
    eps = sample_epsilon(3, 1, generator=g)
    t = lie_exp(torch.tensor([2.0]), eps, affine_generators()[[2]])
    rows = transform_weight_rows(w, t, (2, 6, 6))
    assert rows.shape == (3, 5, 72)
    for s in range(3):
        each = transform_images(w.reshape(5, 2, 6, 6), t[s]).reshape(5, 72)
        assert torch.allclose(rows[s], each, atol=1e-6)


def test_bilinear_resampling_low_pass_filters_white_noise_rows():
    """Interpolating at off-grid points averages neighbours: white-noise RFF rows lose variance."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(2000, 64, generator=g)
    t = torch.linalg.matrix_exp(math.radians(20.0) * affine_generators()[2])
    warped = transform_weight_rows(w, t.unsqueeze(0), (1, 8, 8))[0].reshape(2000, 8, 8)
    inner_var = warped[:, 2:6, 2:6].var()  # away from zero-padded corners
    assert 0.25 < float(inner_var) < 0.75  # E over offsets of Σ bilinear weights² is (2/3)² ≈ 0.44


def test_sample_epsilon_modes():
    eps = sample_epsilon(1000, 3, generator=torch.Generator().manual_seed(0))
    assert eps.shape == (1000, 3) and eps.min() >= -1 and eps.max() <= 1
    assert abs(float(eps.mean())) < 0.05
    grid = sample_epsilon(7, 1, mode="deterministic")
    assert torch.allclose(grid[:, 0], torch.linspace(-1, 1, 7))
    grid2 = sample_epsilon(16, 2, mode="deterministic")
    assert grid2.shape == (16, 2) and set(grid2[:, 0].tolist()) == set(torch.linspace(-1, 1, 4).tolist())
    with pytest.raises(ValueError):
        sample_epsilon(0, 1)
    with pytest.raises(ValueError):
        sample_epsilon(-3, 1)
    with pytest.raises(ValueError, match="unknown sampling mode"):
        sample_epsilon(3, 1, mode="sobol")


def test_subgroups():
    assert resolve_subgroup("rotation") == ("rot",)
    assert resolve_subgroup("translation") == ("tx", "ty")
    assert resolve_subgroup("scale") == ("sx", "sy")
    assert resolve_subgroup("affine") == GENERATOR_NAMES
    assert resolve_subgroup("rot+tx") == ("tx", "rot")
    assert resolve_subgroup(["scale", "rotation"]) == ("rot", "sx", "sy")
    assert resolve_subgroup("none") == ()
    assert generator_indices(("rot", "shear")) == [2, 5]
    with pytest.raises(ValueError, match="unknown symmetry 'spin'"):
        resolve_subgroup("rotation+spin")


def test_rotation_cap_is_pi_and_human_units():
    assert DEFAULT_ETA_MAX["rot"] == pytest.approx(math.pi)
    human = eta_to_human([math.pi / 2, 0.5, math.log(2)], ["rot", "tx", "sx"], image_size=29)
    assert human == {"rot": "±90.0°", "tx": "±7.00 px", "sx": "×0.50…×2.00"}


def test_lie_exp_shape_errors():
    with pytest.raises(ValueError, match="shape mismatch"):
        lie_exp(torch.ones(2), torch.zeros(4, 3), affine_generators()[:2])
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        transform_images(torch.zeros(8, 8), torch.eye(3))
    with pytest.raises(ValueError, match="C\\*h\\*w"):
        transform_weight_rows(torch.zeros(3, 10), torch.eye(3).unsqueeze(0), (1, 3, 3))


def test_warp_stack_matches_transform_images_and_layouts():
    """One grid_sample with the S grids stacked along the height equals S separate warps, for C > 1
    and non-square images; transform_weight_rows' two layouts hold the same values."""
    g = torch.Generator().manual_seed(3)
    images = torch.randn(5, 2, 6, 7, generator=g)
    t = lie_exp(torch.tensor([0.7, 0.3, 0.2]), sample_epsilon(4, 3, generator=g), affine_generators()[[0, 2, 3]])
    out = warp_stack(images, t)
    assert out.shape == (5, 4, 2, 6, 7)
    for s in range(4):
        assert torch.equal(out[:, s], transform_images(images, t[s]))
    w = images.reshape(5, 84)
    shd = transform_weight_rows(w, t, (2, 6, 7))
    hsd = transform_weight_rows(w, t, (2, 6, 7), layout="hsd")
    assert shd.shape == (4, 5, 84) and shd.is_contiguous() and hsd.shape == (5, 4, 84)
    assert torch.equal(shd, hsd.transpose(0, 1))
    with pytest.raises(ValueError, match="layout"):
        transform_weight_rows(w, t, (2, 6, 7), layout="dsh")
    with pytest.raises(ValueError, match=r"\(S, 3, 3\)"):
        warp_stack(images, t[0])


def test_invert_affine_and_det():
    g = torch.Generator().manual_seed(4)
    gens = affine_generators()
    eta = torch.tensor([0.4, 0.3, 1.0, 0.5, 0.2, 0.3])
    eps = sample_epsilon(6, 6, generator=g)
    t = lie_exp(eta, eps, gens)
    inv = invert_affine(t)
    torch.testing.assert_close(inv, lie_exp(eta, -eps, gens), atol=1e-5, rtol=1e-5)  # T⁻¹ = expm(−A)
    torch.testing.assert_close(inv @ t, torch.eye(3).expand(6, 3, 3), atol=1e-5, rtol=0)
    # det T = exp(tr A): only the scale generators sx, sy have a trace
    torch.testing.assert_close(affine_det(t), torch.exp(eps[:, 3] * eta[3] + eps[:, 4] * eta[4]))

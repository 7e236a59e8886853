"""Dynamics models: det J = 1 (volume-preserving), Jᵀ𝕁J = 𝕁 (symplectic), pullback = autodiff / finite
differences, iterate."""

import numpy as np
import pytest

from _helpers import to_numpy
from _layer_checks import check_pullback, jacobian, perturbed_params, random_input, symplectic_form
from geoarray import models

T = 3


def _vp_models():
    return [
        models.VolumePreservingTransformer(3, T, n_blocks=1, n_linear=1, L=2),
        models.VolumePreservingFeedForward(3, n_blocks=2, n_linear=1),
    ]


def _symplectic_models():
    return [
        models.GSympNet(4, n_layers=3, upscale=3),
        models.LASympNet(4, depth=2),
        models.LinearSymplecticTransformer(4, T, L=1, n_sympnet=2, upscale=2),
        models.SymplecticTransformer(4, T, L=1, n_sympnet=1, upscale=2),
    ]


@pytest.mark.parametrize("model", _vp_models(), ids=repr)
def test_volume_preserving_det_one(model, xp, device):
    params = perturbed_params(model, xp, device)
    x = random_input(xp, device, (T, model.dim), scale=0.7)
    J = jacobian(model, params, x, xp)
    assert abs(np.linalg.det(J) - 1) < 1e-8


@pytest.mark.parametrize("model", _symplectic_models(), ids=repr)
def test_symplectic_jacobian(model, xp, device):
    params = perturbed_params(model, xp, device)
    x = random_input(xp, device, (T, model.dim), scale=0.7)
    J = jacobian(model, params, x, xp)
    Jd = symplectic_form(T, model.dim)
    np.testing.assert_allclose(J.T @ Jd @ J, Jd, atol=1e-8)


def test_standard_transformer_is_neither(xp, device):
    # the baseline has no structure: det J ≠ 1 at a generic point (guards the two tests above from
    # passing for any model)
    model = models.StandardTransformerIntegrator(4, T, L=1, upscale=2)
    params = perturbed_params(model, xp, device)
    J = jacobian(model, params, random_input(xp, device, (T, 4)), xp)
    assert abs(np.linalg.det(J) - 1) > 1e-3
    Jd = symplectic_form(T, 4)
    assert np.abs(J.T @ Jd @ J - Jd).max() > 1e-3


@pytest.mark.parametrize(
    "model",
    [*_vp_models(), *_symplectic_models(), models.StandardTransformerIntegrator(4, T, L=1, upscale=2)],
    ids=repr,
)
def test_pullback_matches_autodiff(model, backend, xp, device):
    params = perturbed_params(model, xp, device)
    x = random_input(xp, device, (2, T, model.dim), scale=0.7)
    check_pullback(model, params, x, backend)


def test_iterate_rolls_windows_forward(xp, device):
    model = models.LinearSymplecticTransformer(4, T, upscale=2)
    params = perturbed_params(model, xp, device)
    x = random_input(xp, device, (2, T, 4), scale=0.5)
    out = models.iterate(model, params, x, 7)
    assert out.shape == (2, T + 7, 4)
    y1 = model.apply(params, x)
    y2 = model.apply(params, y1)
    np.testing.assert_allclose(to_numpy(out[:, T : 2 * T, :]), to_numpy(y1), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(to_numpy(out[:, 2 * T : 3 * T, :]), to_numpy(y2), rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="initial_window"):
        models.iterate(model, params, x[:, :2, :], 3)


def test_bad_sizes():
    with pytest.raises(ValueError, match="dim"):
        models.GSympNet(3)
    with pytest.raises(ValueError, match="seq_len"):
        models.VolumePreservingTransformer(3, 0)

"""Seeded sampling: same numbers on every backend, requested dtype/device, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import assert_close, to_numpy
from geoarray import random


@pytest.mark.parametrize("sampler", [random.normal, random.uniform])
def test_same_seed_same_numbers_as_numpy(xp, device, sampler):
    got = sampler(7, (4, 3), xp=xp, device=device)
    host = sampler(7, (4, 3), xp=np)
    assert_close(got, host, xp=xp, device=device, rtol=0, atol=0)


def test_float32_is_the_rounded_float64_draw(xp, device):
    got = random.normal(3, (5,), xp=xp, dtype="float32", device=device)
    assert got.dtype == xp.float32
    np.testing.assert_array_equal(to_numpy(got), random.normal(3, (5,), xp=np).astype(np.float32))


def test_seed_is_reproducible_and_generators_advance(xp, device):
    a = to_numpy(random.normal(11, 6, xp=xp, device=device))
    b = to_numpy(random.normal(11, 6, xp=xp, device=device))
    np.testing.assert_array_equal(a, b)
    gen = random.generator(11)
    c = to_numpy(random.normal(gen, 6, xp=xp, device=device))
    d = to_numpy(random.normal(gen, 6, xp=xp, device=device))
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(c, d)


def test_spawned_seeds_are_distinct():
    children = random.spawn(5, 3)
    draws = [random.normal(s, 8, xp=np) for s in children]
    assert not np.allclose(draws[0], draws[1]) and not np.allclose(draws[1], draws[2])


def test_uniform_range(xp, device):
    u = to_numpy(random.uniform(2, (1000,), xp=xp, low=-2.0, high=3.0, device=device))
    assert u.min() >= -2.0 and u.max() < 3.0
    assert abs(u.mean() - 0.5) < 0.2  # mean 0.5, std of the mean 1.44/sqrt(1000) ≈ 0.046


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True, None])
def test_bad_seeds(xp, seed):
    if seed is None and "torch" in xp.__name__:
        pytest.skip("with xp=torch, seed=None is torch's default generator (test_torch_generators_seed_the_draw...)")
    with pytest.raises((TypeError, ValueError), match="seed must be"):
        random.normal(seed, 3, xp=xp)


def test_bad_shape_and_range(xp):
    with pytest.raises(ValueError, match="shape must be non-negative"):
        random.normal(0, (2, -1), xp=xp)
    with pytest.raises(TypeError, match="shape must be an int"):
        random.normal(0, "3", xp=xp)
    with pytest.raises(ValueError, match="high > low"):
        random.uniform(0, 3, xp=xp, low=1.0, high=1.0)
    with pytest.raises(TypeError, match="dtype must be"):
        random.normal(0, 3, xp=xp, dtype="int32")


def test_torch_generators_seed_the_draw_on_every_backend(xp, device):
    """A torch.Generator is a seed on any backend (one integer drawn from it, advancing it);
    seed=None means torch's default generator with xp=torch and is refused elsewhere."""
    torch = pytest.importorskip("torch", reason="torch.Generator seeds need torch installed")
    a = to_numpy(random.normal(torch.Generator().manual_seed(3), (4, 2), xp=xp, device=device))
    b = to_numpy(random.normal(torch.Generator().manual_seed(3), (4, 2), xp=xp, device=device))
    np.testing.assert_array_equal(a, b)
    gen = torch.Generator().manual_seed(3)
    c = to_numpy(random.normal(gen, (4, 2), xp=xp, device=device))
    d = to_numpy(random.normal(gen, (4, 2), xp=xp, device=device))
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(c, d)
    assert len({float(s.generate_state(1)[0]) for s in random.spawn(torch.Generator().manual_seed(3), 3)}) == 3
    if "torch" in xp.__name__:
        torch.manual_seed(5)
        e = to_numpy(random.normal(None, (3,), xp=xp, device=device))
        torch.manual_seed(5)
        np.testing.assert_array_equal(e, to_numpy(random.normal(None, (3,), xp=xp, device=device)))
    else:
        with pytest.raises(TypeError, match="None only with xp=torch"):
            random.normal(None, (3,), xp=xp, device=device)

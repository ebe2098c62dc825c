import numpy as np
import pytest

from alacarte.datasets import make_se1, make_se2, make_se3


def test_se1_matches_its_formula_and_is_seeded():
    x, y, relevant = make_se1(5000, seed=3)
    assert x.shape == (5000, 18) and relevant == (0, 2, 6, 7, 8)
    f = np.sin((x[:, 0] + x[:, 2]) ** 2) * np.sin(x[:, 6] * x[:, 7] * x[:, 8])
    assert abs(np.std(y - f) - 0.1) < 0.005
    assert np.array_equal(make_se1(5000, seed=3)[1], y)
    assert not np.array_equal(make_se1(5000, seed=4)[1], y)


def test_se2_matches_its_formula():
    x, y, relevant = make_se2(5000, seed=0)
    assert x.shape == (5000, 100) and relevant == (10, 11, 12, 13, 14)
    assert abs(np.std(y - np.log(x[:, 10:15].sum(1) ** 2)) - 0.1) < 0.005


def test_se3_has_five_noisy_copies_per_latent():
    x, y, relevant = make_se3(4000, seed=0)
    assert x.shape == (4000, 1000) and relevant == tuple(range(10))
    corr = np.corrcoef(x[:, :10].T)
    assert (corr[:5, :5] > 0.98).all() and (np.abs(corr[:5, 5:10]) < 0.1).all()
    z1, z2 = x[:, :5].mean(1), x[:, 5:10].mean(1)  # latent estimates (noise std 0.1/sqrt(5))
    r2 = z1**2 + z2**2
    assert np.corrcoef(y, 10 * r2 * np.exp(-2 * r2))[0, 1] > 0.95


def test_generators_reject_bad_sizes():
    for make in (make_se1, make_se2, make_se3):
        with pytest.raises(ValueError, match="n must be a positive integer"):
            make(0)


def test_seeds_are_checked_and_a_list_seed_cannot_draw_the_fixed_rosasco_test_set():
    from alacarte.datasets import make_rosasco, rosasco_split

    # seed=[10_000] seeds numpy exactly as 10_000 does: it drew f1's test inputs as its training inputs
    with pytest.raises(ValueError, match="seed must be None or an integer"):
        rosasco_split("f1", seed=[10_000])
    for bad in (-1, 1.5, True, "a"):
        for make in (make_se1, make_se2, make_se3, lambda n, seed: make_rosasco("f1", n, seed=seed)):
            with pytest.raises(ValueError, match="seed must be None or an integer"):
                make(3, seed=bad)
    assert np.array_equal(make_se1(3, seed=np.int64(5))[1], make_se1(3, seed=5)[1])


def test_an_unknown_rosasco_function_is_named_as_such():
    from alacarte.datasets import make_rosasco, rosasco_split

    # the unknown function is named: rosasco_split("f4", seed=10_000) is not 'seed 10000 draws the fixed
    # test set of f4'
    for function in ("f4", "F1", None, ["f1"]):
        with pytest.raises(ValueError, match="function must be one of"):
            rosasco_split(function, seed=10_000)
        with pytest.raises(ValueError, match="function must be one of"):
            make_rosasco(function, 3)


def test_a_bad_rosasco_noise_fraction_is_a_value_error():
    from alacarte.datasets import make_rosasco, rosasco_split

    # unchecked, "0.1" and None would raise TypeError from '>=', and True be taken as 1.0
    for bad in (-0.1, float("nan"), float("inf"), "0.1", None, True, np.array([0.1, 0.2])):
        with pytest.raises(ValueError, match="noise_fraction"):
            make_rosasco("f1", 3, noise_fraction=bad)
        with pytest.raises(ValueError, match="noise_fraction"):
            rosasco_split("f1", noise_fraction=bad)
    x, y, _ = make_rosasco("f1", 5, seed=1, noise_fraction=0)
    np.testing.assert_array_equal(y, (x[:, 0] ** 4 - x[:, 0] ** 2) * (3 + x[:, 1]))


def test_rosasco_problems_on_the_unit_cube():
    from alacarte.datasets import make_rosasco, rosasco_split
    from alacarte.datasets.synthetic import rosasco_mean_abs

    x, y, _ = make_rosasco("f1", 2000, seed=1, half_width=1.0, noise_fraction=0)
    assert np.abs(x).max() <= 1 and np.abs(x).max() > 0.99
    np.testing.assert_array_equal(y, (x[:, 0] ** 4 - x[:, 0] ** 2) * (3 + x[:, 1]))
    # E|f1| = E(a² − a⁴)·E(3 + b) = (1/3 − 1/5)·3 on [−1, 1]²; f2 = 3 + odd terms is positive there
    assert rosasco_mean_abs("f1", 1.0) == pytest.approx(0.4, rel=1e-9)
    assert rosasco_mean_abs("f2", 1.0) == pytest.approx(3.0, rel=1e-9)
    x3, y3, _ = make_rosasco("f3", 200_000, seed=2, half_width=1.0, noise_fraction=0)
    assert rosasco_mean_abs("f3", 1.0) == pytest.approx(np.abs(y3).mean(), rel=0.01)
    noisy = rosasco_split("f3", seed=3, half_width=1.0)["train"]
    clean = rosasco_split("f3", seed=3, half_width=1.0, noise_fraction=0)["train"]
    np.testing.assert_array_equal(noisy[0], clean[0])
    assert np.var(noisy[1] - clean[1]) == pytest.approx(0.01 * rosasco_mean_abs("f3", 1.0), rel=0.5)
    for bad in (0, -1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="half_width"):
            make_rosasco("f1", 3, half_width=bad)


def test_rosasco_mean_abs_constants_are_right_to_round_off():
    from scipy import integrate

    from alacarte.datasets.synthetic import ROSASCO_MEAN_ABS

    # f1 = (a⁴ − a²)(3 + b) with 3 + b ≥ 0: E|f1| = E|a⁴ − a²|·3 = (39.6 + 4/15)/3·3 = 598/15
    assert ROSASCO_MEAN_ABS["f1"] == pytest.approx(598 / 15, rel=1e-10)

    def inner(b):  # ∫_{-3}^{3} |c(a³ − a) + k| da, exactly, between the real roots of the cubic in a
        c, k = 2 * (2 * b - 1) * (b + 1), b**3 - b + 3
        roots = np.roots([c, 0.0, -c, k]) if c != 0 else []
        ends = [-3.0, *sorted(r.real for r in roots if abs(r.imag) < 1e-12 and -3 < r.real < 3), 3.0]
        antiderivative = np.polyint([c, 0.0, -c, k])
        return sum(abs(np.polyval(antiderivative, hi) - np.polyval(antiderivative, lo)) for lo, hi in zip(ends, ends[1:]))

    # to 1e-10: 59.972864355, 2.3e-7 below this, would fail
    mean_abs = integrate.quad(inner, -3, 3, points=[-1.0, 0.5], epsabs=1e-12, epsrel=1e-12, limit=500)[0] / 36
    assert ROSASCO_MEAN_ABS["f2"] == pytest.approx(mean_abs, rel=1e-10)

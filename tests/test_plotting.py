"""Pictures of trained kernels, and the relevances they show."""
import numpy as np
import pytest
import torch

import alacarte as ac
from alacarte.plotting import relevance, save_kernel_figure

# numpy < 2 (setup.cfg allows 1.24) names it trapz
_trapezoid = getattr(np, "trapezoid", None) or np.trapz

pytest.importorskip("matplotlib")


def test_relevance_follows_inverse_lengthscales():
    kernel = ac.FSARDKernel(4, 32, ard_num_dims=4, seed=0)
    kernel.lengthscale = torch.tensor([1.0, 2.0, 4.0, 0.5])
    rel = relevance(kernel)
    assert np.allclose(rel, np.array([1, 0.5, 0.25, 2]) / 3.75)
    iso = ac.FastfoodRBFKernel(3, 16, seed=0)
    assert np.allclose(relevance(iso), 1 / 3)


def test_gm_relevance_weights_scales():
    kernel = ac.SpectralMixtureFastfoodKernel(2, 8, num_components=2, seed=0)
    kernel.weights = torch.tensor([1.0, 3.0])
    kernel.scales = torch.tensor([[1.0, 0.0001], [1.0, 1.0]])
    rel = relevance(kernel)
    assert np.isclose(rel.sum(), 1.0) and rel[0] > rel[1]


@pytest.mark.parametrize("make", [
    lambda: ac.SpectralMixtureFastfoodKernel(3, 16, num_components=2, seed=0),
    lambda: ac.PiecewiseLinearRadialKernel(3, 16, num_components=2, ard_num_dims=3, seed=0),
    lambda: ac.FSARDKernel(3, 64, ard_num_dims=3, seed=0),
    lambda: ac.FSGBARDKernel(3, 64, ard_num_dims=3, seed=0),
    lambda: ac.FastfoodRBFKernel(3, 64, seed=0),
])
def test_figure_is_a_png(make, tmp_path):
    path = save_kernel_figure(make(), tmp_path / "kernel.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_unsupported_kernel_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no spectrum picture for RandomFourierKernel: pictures exist for GM, PWL"):
        save_kernel_figure(ac.RandomFourierKernel(2, 8, seed=0), tmp_path / "x.png")


def test_names_that_do_not_match_the_inputs_are_a_clear_error_and_no_figure_is_left_open(tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    kernel = ac.SpectralMixtureFastfoodKernel(3, 16, num_components=2, seed=0)
    open_before = plt.get_fignums()
    with pytest.raises(ValueError, match="names has 2 entries but the kernel has 3 inputs"):
        save_kernel_figure(kernel, tmp_path / "x.png", names=["a", "b"])
    with pytest.raises(ValueError, match="no spectrum picture"):
        save_kernel_figure(ac.RandomFourierKernel(2, 8, seed=0), tmp_path / "y.png")
    assert plt.get_fignums() == open_before and not list(tmp_path.iterdir())


def test_gm_spectrum_is_drawn_per_unit_of_the_data_given_the_input_scale():
    """A model standardises x: its kernel's ω are per standard deviation of each column. 'alacarte plot'
    labelled them 'rad / unit' and drew the same picture for a column in metres and in millimetres."""
    from alacarte.plotting import plot_spectrum

    plt = pytest.importorskip("matplotlib.pyplot")
    kernel = ac.SpectralMixtureFastfoodKernel(2, 16, num_components=2, seed=0).double()
    axes = plot_spectrum(kernel, names=["a", "b"])
    axes_mm = plot_spectrum(kernel, names=["a", "b"], input_scale=torch.tensor([1000.0, 1.0]))
    (omega, dens), (omega_mm, dens_mm) = [ax.get_lines()[0].get_data() for ax in (axes[0], axes_mm[0])]
    np.testing.assert_allclose(omega_mm, omega / 1000, rtol=1e-15)
    np.testing.assert_allclose(dens_mm, dens * 1000, rtol=1e-15)
    # still a density: its integral is the kernel's weight, whatever the units
    weight = float(kernel.weights.sum())
    for x, p in ((omega, dens), (omega_mm, dens_mm)):
        assert _trapezoid(p, x) == pytest.approx(weight, rel=1e-3)
    assert axes_mm[0].get_xlabel() == "ω (rad / unit of a)"
    np.testing.assert_array_equal(axes_mm[1].get_lines()[0].get_data(), axes[1].get_lines()[0].get_data())
    with pytest.raises(ValueError, match="input_scale must hold 2 positive finite numbers"):
        plot_spectrum(kernel, input_scale=[1.0, 0.0])
    plt.close("all")


def test_gm_spectrum_in_axes_of_the_users_needs_one_per_input_and_says_so():
    """A GM kernel of 3 inputs needs 3 Axes: one Axes is a ValueError that says so, not an IndexError
    (index 1 is out of bounds); a 2×2 grid of axes (plt.subplots(2, 2)) gets a panel per Axes, not per row."""
    from alacarte.plotting import plot_spectrum

    plt = pytest.importorskip("matplotlib.pyplot")
    kernel = ac.SpectralMixtureFastfoodKernel(3, 16, num_components=2, seed=0)
    _, ax = plt.subplots()
    with pytest.raises(ValueError, match="ax must hold 3 axes, got 1; or leave ax=None"):
        plot_spectrum(kernel, ax=ax)
    _, grid = plt.subplots(2, 2)
    drawn = plot_spectrum(kernel, ax=grid)
    assert [len(a.get_lines()) for a in drawn] == [1, 1, 1, 0]
    plt.close("all")


def test_radial_spectra_take_axes_as_gm_does():
    """plot_spectrum takes ``Axes | Sequence[Axes]``, but a PWL or FSARD kernel given a list of one Axes, a
    1×1 array (plt.subplots(squeeze=False)) or a grid draws in the first, not an AttributeError ('list'
    object has no attribute 'plot'); an empty list is a ValueError."""
    from alacarte.plotting import plot_spectrum

    plt = pytest.importorskip("matplotlib.pyplot")
    for kernel in (ac.PiecewiseLinearRadialKernel(3, 16, num_components=2, ard_num_dims=3, seed=0),
                   ac.FSARDKernel(3, 16, ard_num_dims=3, seed=0)):
        one, grid = plt.subplots()[1], plt.subplots(2, 2)[1]
        assert plot_spectrum(kernel, ax=[one]) is one and one.has_data()
        assert plot_spectrum(kernel, ax=grid) is grid[0, 0] and not grid[1, 1].has_data()
        assert plot_spectrum(kernel, ax=plt.subplots(1, 1, squeeze=False)[1]).has_data()
        with pytest.raises(ValueError, match="ax must hold 1 axes, got 0"):
            plot_spectrum(kernel, ax=[])
    plt.close("all")


def test_figure_is_written_to_the_path_given_even_without_a_suffix(tmp_path):
    """matplotlib appended '.png' to a path without a suffix: 'alacarte plot m --out pic' said
    'saved pic' and wrote pic.png."""
    kernel = ac.FSARDKernel(2, 16, ard_num_dims=2, seed=0)
    assert save_kernel_figure(kernel, tmp_path / "pic") == tmp_path / "pic"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pic"]
    assert (tmp_path / "pic").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_gm_picture_of_many_inputs_draws_the_most_relevant_and_says_what_it_leaves_out(tmp_path):
    """17 inputs, input 12 holding most of the relevance: the panels are the 8 most relevant inputs in
    input order (12 among them), each titled with its share, and the first says what is not drawn."""
    from alacarte.plotting import plot_spectrum, shown_inputs

    plt = pytest.importorskip("matplotlib.pyplot")
    kernel = ac.SpectralMixtureFastfoodKernel(17, 32, num_components=2, seed=0)
    scales = (0.1 + 0.01 * torch.arange(17.0)).expand(2, 17).clone()  # distinct: no ties to break
    scales[:, 12] = 5.0
    scales[:, 3] = 1.0
    kernel.scales = scales
    share = relevance(kernel)
    expected = sorted(np.argsort(-share)[:8].tolist())
    assert expected == [3, 10, 11, 12, 13, 14, 15, 16]
    assert shown_inputs(kernel).tolist() == expected
    names = [f"x{j}" for j in range(17)]
    drawn = plot_spectrum(kernel, names=names)
    assert [a.get_title().split(" ")[0] for a in drawn] == [names[j] for j in expected]
    assert f"({share[12]:.0%} relevance)" in drawn[expected.index(12)].get_title()
    note = " ".join(t.get_text() for t in drawn[0].texts)
    assert "8 most relevant of 17 inputs" in note and f"{1 - share[expected].sum():.0%}" in note
    plt.close("all")
    save_kernel_figure(kernel, tmp_path / "gm.png", names=names)
    assert (tmp_path / "gm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_fsard_legend_names_the_padding_of_the_inputs():
    from alacarte.plotting import plot_spectrum

    plt = pytest.importorskip("matplotlib.pyplot")
    legend = [t.get_text() for t in plot_spectrum(ac.FSARDKernel(17, 32, ard_num_dims=17, seed=0)).get_legend().get_texts()]
    assert "initial density of s_i (χ_32, 17 inputs padded to 32)" in legend
    legend = [t.get_text() for t in plot_spectrum(ac.FSARDKernel(16, 32, ard_num_dims=16, seed=0)).get_legend().get_texts()]
    assert "initial density of s_i (χ_16)" in legend
    plt.close("all")

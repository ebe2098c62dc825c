"""Crafted model files: every record field is checked before anything is built from it."""
import sys

import numpy as np
import pytest
import torch

import alacarte as ac
from alacarte import AlaCarteRegressor
from alacarte.factory import KERNEL_NAMES, make_model
from alacarte.io import MAGIC, load_model, save_model
from alacarte.kernels import FeatureKernel
from alacarte._records import KERNEL_CLASSES

from model_files import payload, with_payload


def data(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x, np.sin(x).sum(1) + 0.1 * rng.normal(size=n)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small fitted FSARD model's file and the model."""
    model = make_model("fsard", 3, num_samples=16, seed=0)
    ac.fit(model, *data(), max_iter=3, restarts=0, progress=False)
    path = save_model(model, tmp_path_factory.mktemp("records") / "m.alacarte")
    return path.read_bytes(), model


def crafted(good: bytes, edit, tmp_path):
    """The file ``good`` with its payload edited by ``edit(payload)``, checksums recomputed."""
    obj = payload(good, MAGIC)
    edit(obj)
    path = tmp_path / "crafted.alacarte"
    path.write_bytes(with_payload(good, MAGIC, obj))
    return path


def test_every_kernel_class_of_alacarte_is_registered():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    concrete = {f"{c.__module__}:{c.__qualname__}": c for c in subclasses(FeatureKernel)
                if c.__module__.startswith("alacarte.")
                and c.__name__ not in ("MixtureFeatureKernel", "FastfoodMixtureKernel")}  # abstract
    assert concrete == KERNEL_CLASSES


def test_a_file_naming_a_module_to_import_is_refused_before_importing_it(saved, tmp_path, monkeypatch):
    """A file naming alacarte.__main__ ran the command line on the host program's argv inside load_model."""
    good, _ = saved
    monkeypatch.setattr(sys, "argv", ["alacarte", "demo"])
    sys.modules.pop("alacarte.__main__", None)
    for name in ("alacarte.__main__:main", "alacarte.cli:main", "os:system", "alacarte.kernels.base:FeatureKernel"):
        path = crafted(good, lambda p: p["record"]["kernel"].update({"class": name}), tmp_path)
        with pytest.raises(ValueError, match=r"record\.kernel\.class: .* is not one of alacarte's kernel classes"):
            load_model(path)
    assert "alacarte.__main__" not in sys.modules


def test_sizes_the_file_cannot_hold_are_refused_before_allocating(saved, tmp_path):
    """num_samples = 2**33 is refused before load_model tries to allocate 64 GiB."""
    good, _ = saved
    cases = [
        (lambda p: p["record"]["kernel"]["config"].update(num_samples=2**33),
         r"config\.num_samples: expected an integer"),
        (lambda p: p["record"]["kernel"]["config"].update(num_dims=2**40), r"config\.num_dims: expected an integer"),
        (lambda p: p["record"]["kernel"]["config"].update(batch_shape=[1000]),
         r"record\.kernel\.config: 16000 random features"),
        (lambda p: p["record"]["kernel"]["config"].update(batch_shape=[2**20, 2**20]), r"batch_shape\[0\]"),
        (lambda p: p["record"]["kernel"]["config"].update(num_samples=32), r"state_dict: does not fit|state_dict\["),
        (lambda p: p["record"].update(num_dims=-1), r"record\.num_dims"),
    ]
    for edit, message in cases:
        with pytest.raises(ValueError, match=message):
            load_model(crafted(good, edit, tmp_path))


def test_truncated_or_misshapen_tensors_are_refused_at_load_not_in_predict(saved, tmp_path):
    """Truncated posterior weights are refused at load, not left to fail predict with 'mat1 and mat2 shapes
    cannot be multiplied'."""
    good, _ = saved

    def truncate(key, part="posterior"):
        def edit(p):
            p["record"][part][key] = p["record"][part][key][..., :-1]
        return edit

    cases = [
        (truncate("weights"), r"record\.posterior\.weights: expected shape \(32,\), got \(31,\)"),
        (truncate("cholesky"), r"record\.posterior\.cholesky: expected shape \(32, 32\)"),
        (truncate("covar_module.raw_radius", "state_dict"), r"record\.state_dict\['covar_module\.raw_radius'\]"),
        (lambda p: p["record"].update(train_inputs=p["record"]["train_inputs"][:, :2]), r"record\.train_inputs"),
        (lambda p: p["record"].update(train_targets=p["record"]["train_targets"][:-1]), r"record\.train_targets"),
        (lambda p: p["record"]["posterior"].update(noise=torch.ones(3, dtype=torch.float64)), r"posterior\.noise"),
        (lambda p: p["record"]["posterior"].update(weights=p["record"]["posterior"]["weights"].float()),
         r"posterior\.weights: expected a dense tensor of torch\.float64"),
        (lambda p: p["record"]["state_dict"].pop("input_offset"), r"missing \['input_offset'\]"),
        (lambda p: p["record"].update(frozen=["nothing"]), r"record\.frozen\[0\]: 'nothing' is not a parameter"),
        (lambda p: p["record"].update(dtype="float16"), r"record\.dtype"),
        (lambda p: p["record"].update(extra=1), r"record: unexpected entry 'extra'"),
        (lambda p: p["record"]["kernel"]["config"].update(seed="0"), r"config\.seed"),
        (lambda p: p["record"]["kernel"]["config"].update(strategy="nonsense"), r"record\.kernel\.config: "),
    ]
    for edit, message in cases:
        with pytest.raises(ValueError, match=message):
            load_model(crafted(good, edit, tmp_path))


def test_a_file_re_saved_unchanged_still_loads_and_predicts_bit_identically(saved, tmp_path):
    good, model = saved
    loaded = load_model(crafted(good, lambda p: None, tmp_path))
    x = torch.as_tensor(data(n=7, seed=3)[0])
    a, b = model.predict(x), loaded.predict(x)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)


def test_regressor_records_are_checked(tmp_path):
    x, y = data()
    reg = AlaCarteRegressor("gm", num_samples=16, num_components=2, max_iter=3, restarts=0).fit(x, y)
    good = save_model(reg, tmp_path / "r.alacarte").read_bytes()
    cases = [
        (lambda p: p["record"]["params"].update(kernel=torch.zeros(2)), r"record\.params\.kernel: expected a plain"),
        (lambda p: p["record"]["params"].update(surprise=1), r"record\.params: unexpected entry 'surprise'"),
        (lambda p: p["record"]["fitted"].update(n_features_in_=4), r"record\.fitted\.n_features_in_"),
        (lambda p: p["record"]["fitted"]["history"].update(loss="low"), r"record\.fitted\.history\.loss"),
        (lambda p: p["record"]["fitted"]["model"]["posterior"].pop("weights"),
         r"record\.fitted\.model\.posterior: the entry 'weights' is missing"),
    ]
    for edit, message in cases:
        with pytest.raises(ValueError, match=message):
            load_model(crafted(good, edit, tmp_path))
    kernel_reg = AlaCarteRegressor(ac.FSARDKernel(3, 16, seed=1))
    good = save_model(kernel_reg, tmp_path / "k.alacarte").read_bytes()
    edit = lambda p: p["record"]["params"]["kernel"]["object"]["config"].update(num_samples=2**33)  # noqa: E731
    with pytest.raises(ValueError, match=r"record\.params\.kernel\.object\.config\.num_samples"):
        load_model(crafted(good, edit, tmp_path))


@pytest.mark.parametrize("name", [n for n in KERNEL_NAMES if not n.startswith("exact")])
def test_every_kernel_saves_under_a_registered_name(name, tmp_path):
    model = make_model(name, 3, num_samples=16, num_components=2, seed=0)
    record = payload(save_model(model, tmp_path / "m.alacarte").read_bytes(), MAGIC)["record"]
    assert record["kernel"]["class"] in KERNEL_CLASSES


def test_values_no_saved_model_holds_are_refused(saved, tmp_path):
    """Found by tests/test_fuzz.py: a list as the dtype escaped as a TypeError ('unhashable'), an index
    beyond its block in Fastfood's perm as a RuntimeError in predict."""
    good, _ = saved

    def state(key, value):
        return lambda p: p["record"]["state_dict"].__setitem__(key, value)

    perm = payload(good, MAGIC)["record"]["state_dict"]["covar_module.perm"]
    cases = [
        (lambda p: p["record"].update(dtype=["float64"]), r"record\.dtype: expected one of"),
        (lambda p: p["record"].update({"class": {"FeatureGP": 1}}), r"record\.class: expected one of"),
        (state("covar_module.perm", perm + 2**40), r"\['covar_module\.perm'\]: a row is not a permutation"),
        (state("covar_module.perm", torch.zeros_like(perm)), r"a row is not a permutation"),
        (state("covar_module.raw_lengthscale", torch.full((1, 3), float("nan"), dtype=torch.float64)), r"holds NaN"),
        (state("input_scale", torch.zeros(3, dtype=torch.float64)), r"\['input_scale'\]: holds a value ≤ 0"),
        (lambda p: p["record"]["posterior"].update(noise=torch.tensor(-1.0, dtype=torch.float64)),
         r"posterior\.noise: holds a value ≤ 0"),
    ]
    for edit, message in cases:
        with pytest.raises(ValueError, match=message):
            load_model(crafted(good, edit, tmp_path))


@pytest.mark.filterwarnings("ignore:A not p.d., added jitter")
def test_an_exact_gp_that_cannot_factorise_its_covariance_predicts_a_value_error(tmp_path):
    """Found by tests/test_fuzz.py: raw_outputscale = +inf in a file loaded, and predict escaped with
    linear_operator's NotPSDError; +inf is refused at load, and a covariance that cannot be factorised
    (here σ² = −1 under a bound moved below 0) is a ValueError as for a FeatureGP."""
    x, y = data()
    model = make_model("exact-ard", 3)
    ac.fit(model, x, y, max_iter=2, restarts=0, progress=False)
    good = save_model(model, tmp_path / "e.alacarte").read_bytes()
    infinite = lambda p: p["record"]["state_dict"]["covar_module.raw_outputscale"].fill_(float("inf"))  # noqa: E731
    with pytest.raises(ValueError, match=r"\['covar_module\.raw_outputscale'\]: holds \+inf"):
        load_model(crafted(good, infinite, tmp_path))
    state = model.state_dict()
    state["likelihood.noise_covar.raw_noise_constraint.lower_bound"].fill_(-1.0)
    state["likelihood.noise_covar.raw_noise"].fill_(-float("inf"))
    model.load_state_dict(state)
    with pytest.raises(ValueError, match="cannot be factorised"):
        model.predict(torch.as_tensor(x[:3]))


def test_a_tensor_where_a_count_belongs_is_a_value_error(tmp_path):
    """Found by tests/test_fuzz.py: n_features_in_ = tensor([1, 2]) escaped as 'Boolean value of Tensor
    with more than one value is ambiguous'."""
    x, y = data()
    reg = AlaCarteRegressor("fsard", num_samples=16, max_iter=2, restarts=0).fit(x, y)
    good = save_model(reg, tmp_path / "r.alacarte").read_bytes()
    for value in (torch.tensor([1, 2]), 3.0, True):
        with pytest.raises(ValueError, match=r"record\.fitted\.n_features_in_"):
            load_model(crafted(good, lambda p: p["record"]["fitted"].update(n_features_in_=value), tmp_path))

"""fit(checkpoint=...): a fit killed anywhere resumes and ends bit for bit where the uninterrupted fit does."""
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch

import alacarte.training._optimization as optimization
import alacarte.training._stages as training_stages
from alacarte import FeatureGP, FSARDKernel, fit
from alacarte.factory import make_model
from alacarte._checkpoint import saved_progress


class Killed(Exception):
    """Stands for the process being killed at a given evaluation of the likelihood."""


def _data(n=120, noise=0.1):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4))
    return x, np.sin(x[:, 0]) + 0.5 * x[:, 1] ** 2 + noise * rng.normal(size=n)


def _fit(build, x, y, kill_at=None, **settings):
    """(model, history, evaluations of the likelihood); raises Killed at evaluation ``kill_at``."""
    evaluate, calls = optimization.negative_mll, [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_at:
            raise Killed
        return evaluate(*args, **kwargs)

    model = build()
    optimization.negative_mll = counted
    try:
        history = fit(model, x, y, progress=False, **settings)
    finally:
        optimization.negative_mll = evaluate
    return model, history, calls[0]


def _assert_same_fit(a, b):
    (model_a, history_a, _), (model_b, history_b, _) = a, b
    state_b = model_b.state_dict()
    for name, value in model_a.state_dict().items():
        assert torch.equal(value, state_b[name]), name
    for field in ("loss", "converged", "restart_losses", "chosen_restart", "noise_refit_loss"):
        assert getattr(history_a, field) == getattr(history_b, field), field


def _simplex():
    return make_model(FSARDKernel(num_dims=4, num_samples=16, ard_num_dims=4, simplex=True, seed=0), 4)


CASES = {
    "gm, L-BFGS": (lambda: make_model("gm", 4, num_samples=16), {}, 0.1),
    "simplex FSARD (π by projected gradient)": (_simplex, {}, 0.1),
    "SSGPR, Adam": (lambda: make_model("ssgpr", 4, num_samples=16), {"optimizer": "adam"}, 0.1),
    "exact ARD": (lambda: make_model("exact-ard", 4), {}, 0.1),
    "FSARD, streamed": (lambda: make_model("fsard", 4, num_samples=16), {"chunk_size": 50}, 0.1),
    "FSARD, noise-free (the noise refit)": (lambda: make_model("fsard", 4, num_samples=32), {}, 0.0),
    "FSGBARD (restarts hold its blocks)": (lambda: make_model("fsgbard", 4, num_samples=16), {}, 0.1),
    "gm, held-out rows": (lambda: make_model("gm", 4, num_samples=16), {"validation_fraction": 0.2}, 0.1),
}


@pytest.mark.parametrize("case", CASES)
def test_a_fit_killed_anywhere_resumes_bit_for_bit(case, tmp_path, monkeypatch):
    build, options, noise = CASES[case]
    x, y = _data(noise=noise)
    settings = dict(max_iter=12, restarts=2, restart_iter=3, **options)
    reference = _fit(build, x, y, **settings)
    if noise == 0.0:
        assert reference[1].noise_refit_loss is not None  # the case reaches the refit stage
    monkeypatch.setattr(training_stages, "CHECKPOINT_INTERVAL", 0.0)  # save at every iteration
    evaluations = reference[2]
    stages, repeated = set(), []
    for kill_at in np.linspace(2, evaluations, 7).astype(int):
        path = tmp_path / f"killed-at-{kill_at}.ckpt"
        with pytest.raises(Killed):
            _fit(build, x, y, kill_at=kill_at, checkpoint=path, **settings)
        stages.add(saved_progress(path)["stage"][0])
        resumed = _fit(build, x, y, checkpoint=path, **settings)
        _assert_same_fit(resumed, reference)
        repeated.append(resumed[2] + (kill_at - 1) - evaluations)  # evaluations run twice
        finished = _fit(build, x, y, checkpoint=path, **settings)
        _assert_same_fit(finished, reference)
        assert finished[2] == 0  # a finished fit's checkpoint gives its result without training
        assert finished[1].seconds == resumed[1].seconds
    assert {"restart", "final"} <= stages
    # It went on from the checkpoint, not from the start: at most an iteration is run again.
    assert 0 <= min(repeated) and max(repeated) <= optimization.LBFGS_MAX_EVAL + 2, repeated
    if noise == 0.0:
        assert "refit" in stages


@pytest.mark.parametrize("ending", ["converges", "fails twice"])
def test_a_fit_killed_at_any_evaluation_keeps_its_convergence_count_and_failure(ending, tmp_path, monkeypatch):
    """A coarse tolerance makes the fit end after three calm iterations in a row; a
    factorisation that breaks at two iterations in a row ends it at the second failure.
    Killed at every evaluation of its last iterations, the resumed fit must count on from
    where it was killed (a count of calm iterations or a failure forgotten ends the fit
    later, with other losses)."""
    from linear_operator.utils.errors import NotPSDError

    x, y = _data()
    build = lambda: make_model("gm", 4, num_samples=16)  # noqa: E731
    settings = dict(max_iter=40, restarts=0, tolerance=1e-2 if ending == "converges" else 0.0)
    if ending == "fails twice":
        loss = optimization.Optimization._loss

        def poisoned(self, backward):
            value = loss(self, backward)  # (counted: a kill may come first)
            if self.iteration in (6, 7):
                raise NotPSDError("the factorisation broke")
            return value

        monkeypatch.setattr(optimization.Optimization, "_loss", poisoned)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reference = _fit(build, x, y, **settings)
    if ending == "converges":
        assert reference[1].converged and len(reference[1].loss) < settings["max_iter"]
    else:
        assert len(reference[1].loss) == 5 and "training stopped after 5 iterations" in str(caught[-1].message)
    monkeypatch.setattr(training_stages, "CHECKPOINT_INTERVAL", 0.0)
    saved = []  # (calm, failed) of the checkpoint each resumed fit starts from
    for kill_at in range(max(2, reference[2] - 15), reference[2] + 1):  # the iterations before the end
        path = tmp_path / f"killed-at-{kill_at}.ckpt"
        with pytest.raises(Killed):
            _fit(build, x, y, kill_at=kill_at, checkpoint=path, **settings)
        run = saved_progress(path)["run"]
        saved.append((run["calm"], run["failed"]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _assert_same_fit(_fit(build, x, y, checkpoint=path, **settings), reference)
    # killed in the states at stake: two calm iterations counted, or one failure behind
    assert ((2, False) if ending == "converges" else (0, True)) in saved, saved


def test_checkpoint_of_another_fit_is_refused(tmp_path):
    x, y = _data()
    path = tmp_path / "fit.ckpt"
    settings = dict(max_iter=3, restarts=1, restart_iter=2)
    model = make_model("fsard", 4, num_samples=16)
    fit(model, x, y, progress=False, checkpoint=path, **settings)
    cases = [
        (make_model("fsard", 4, num_samples=16), x, y, dict(settings, seed=1), "seed: 0 there, 1 here"),
        (make_model("fsard", 4, num_samples=16), x, y, dict(settings, max_iter=4), "max_iter: 3 there, 4 here"),
        (make_model("fsard", 4, num_samples=16), x, 2 * y, settings, "the training data differ"),
        (make_model("fsard", 4, num_samples=16, seed=1), x, y, settings, "the model given to fit differs"),
        (model, x, y, settings, "the model given to fit differs"),  # already fitted: it would start elsewhere
    ]
    for other, x_, y_, options, message in cases:
        with pytest.raises(ValueError, match=f"is of another fit .*{message}"):
            fit(other, x_, y_, progress=False, checkpoint=path, **options)


def test_a_frozen_parameter_makes_another_fit(tmp_path):
    x, y = _data()
    path = tmp_path / "fit.ckpt"
    fit(make_model("fsard", 4, num_samples=16), x, y, max_iter=2, restarts=0, progress=False, checkpoint=path)
    model = make_model("fsard", 4, num_samples=16)
    model.likelihood.raw_noise.requires_grad_(False)
    with pytest.raises(ValueError, match="the model given to fit differs"):
        fit(model, x, y, max_iter=2, restarts=0, progress=False, checkpoint=path)


def test_a_kernel_or_constraint_built_otherwise_makes_another_fit(tmp_path):
    """Settings that are no tensor change the fit too: the FWHT and dense Fastfood products round
    differently (final loss -0.36181 and -0.36200 per point), and an exp-transformed noise
    constraint trains another parameter (-0.36046); either resumed the other's checkpoint."""
    from gpytorch.constraints import GreaterThan
    from gpytorch.likelihoods import GaussianLikelihood

    x, y = _data()
    settings = dict(max_iter=3, restarts=1, restart_iter=2, progress=False)

    def build(strategy="dense", likelihood=None):
        return FeatureGP(None, None, FSARDKernel(num_dims=4, num_samples=16, ard_num_dims=4, seed=0,
                                                 strategy=strategy), likelihood=likelihood)

    path = tmp_path / "fit.ckpt"
    fit(build(), x, y, checkpoint=path, **settings)
    fit(build(), x, y, checkpoint=path, **settings)  # the same model as built resumes
    exp_noise = GaussianLikelihood(noise_constraint=GreaterThan(1e-4, transform=torch.exp))
    for other in (build("fwht"), build(likelihood=exp_noise)):
        with pytest.raises(ValueError, match="the model given to fit differs"):
            fit(other, x, y, checkpoint=path, **settings)


def test_a_checkpoint_of_the_previous_format_is_refused_as_such(tmp_path):
    """A checkpoint of another format fingerprints the model otherwise: read as this format, it would be
    refused as "the model given to fit differs" for the very model that wrote it.  The format version
    says why."""
    from alacarte._checkpoint import FORMAT_VERSION, SIGNATURE, _read_record
    from alacarte._files import write_checked

    x, y = _data()
    settings = dict(max_iter=3, restarts=0, progress=False)
    path = tmp_path / "fit.ckpt"
    fit(make_model("fsard", 4, num_samples=16), x, y, checkpoint=path, **settings)
    write_checked(path, SIGNATURE, {"format_version": 1}, _read_record(path))
    with pytest.raises(ValueError, match=f"of format version 1; this alacarte reads format version {FORMAT_VERSION}"):
        fit(make_model("fsard", 4, num_samples=16), x, y, checkpoint=path, **settings)


def test_a_numpy_integer_setting_resumes_the_fit_of_its_python_integer(tmp_path):
    """Stored as given, np.int64(4) (what X.shape arithmetic in numpy gives) would stay a numpy integer,
    which the model fingerprint skips where it hashes a Python 4, so the very same fit would be refused
    as "the model given to fit differs".  ard_num_dims is stored as an int, checked like num_dims (4.0
    would be a TypeError from torch.zeros, True taken as 1)."""
    x, y = _data()
    settings = dict(max_iter=3, restarts=1, restart_iter=2, progress=False)
    path = tmp_path / "fit.ckpt"

    def build(ard_num_dims):
        return FeatureGP(None, None, FSARDKernel(num_dims=4, num_samples=16, ard_num_dims=ard_num_dims, seed=0))

    first = fit(build(4), x, y, checkpoint=path, **settings)
    assert fit(build(np.int64(4)), x, y, checkpoint=path, **settings).loss == first.loss
    for bad in (4.0, True):
        with pytest.raises(ValueError, match="ard_num_dims must be a positive integer"):
            build(bad)


def test_the_model_fingerprint_reads_numpy_scalars_as_the_python_values_they_equal():
    """Any plain setting, not only ard_num_dims: np.float64(0.5) must not hash as 'np.float64(0.5)' nor
    np.int64 be skipped, so that the same model spelt with numpy scalars fingerprints alike."""
    from alacarte._checkpoint import model_fingerprint

    def build(value):
        model = FeatureGP(None, None, FSARDKernel(num_dims=4, num_samples=16, seed=0))
        model.covar_module.a_setting = value
        return model

    for python, numpy in ((0.5, np.float64(0.5)), (3, np.int64(3)), (True, np.bool_(True))):
        assert model_fingerprint(build(python)) == model_fingerprint(build(numpy)), python
    assert model_fingerprint(build(0.5)) != model_fingerprint(build(0.25))


def test_unreadable_checkpoints_are_refused(tmp_path):
    x, y = _data()
    settings = dict(max_iter=3, restarts=0, progress=False)
    path = tmp_path / "fit.ckpt"
    fit(make_model("fsard", 4, num_samples=16), x, y, checkpoint=path, **settings)
    good = path.read_bytes()
    truncated, flipped, other, text = (tmp_path / name for name in ("truncated", "flipped", "weights.pt", "notes.txt"))
    truncated.write_bytes(good[:-100])
    flipped.write_bytes(good[:-100] + bytes([good[-100] ^ 1]) + good[-99:])  # one bit: torch would read it
    torch.save({"weights": torch.ones(3)}, other)
    text.write_text("train loss 0.31\n")
    cases = [
        (truncated, "is truncated: .*delete it to fit from the start"),
        (flipped, "is damaged: its data do not match their SHA-256 checksum"),
        (other, "is not an alacarte fit checkpoint"),
        (text, "is not an alacarte fit checkpoint"),
        (tmp_path, "is a directory"),
        (tmp_path / "missing" / "fit.ckpt", "does not exist"),
    ]
    for where, message in cases:
        with pytest.raises(ValueError, match=message):
            fit(make_model("fsard", 4, num_samples=16), x, y, checkpoint=where, **settings)
    # A path no checkpoint can be written to is refused before a streamed fit reads any data.
    chunks_read = []

    class Chunks:
        def __iter__(self):
            for start in range(0, len(x), 40):
                chunks_read.append(start)
                yield torch.as_tensor(x[start:start + 40]), torch.as_tensor(y[start:start + 40])

    fit(make_model("fsard", 4, num_samples=16), Chunks(), None, **settings)
    assert chunks_read  # (it is a streamed fit that reads the chunks)
    chunks_read.clear()
    for where, message in cases[-2:]:
        with pytest.raises(ValueError, match=message):
            fit(make_model("fsard", 4, num_samples=16), Chunks(), None, checkpoint=where, **settings)
    assert chunks_read == []


KILLED_FIT = """
import sys, numpy as np, torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
import alacarte.training._stages as training_stages
from test_checkpoint import _data, SIGKILL_SETTINGS
from alacarte import fit
from alacarte.factory import make_model
training_stages.CHECKPOINT_INTERVAL = 0.0
x, y = _data(n=300)
fit(make_model("fsard", 4, num_samples=64), x, y, progress=False, checkpoint={path!r}, **SIGKILL_SETTINGS)
"""
# tolerance 0: the final optimisation runs its 150 iterations (a few seconds), time enough to kill it
SIGKILL_SETTINGS = dict(max_iter=150, restarts=2, restart_iter=3, tolerance=0.0)


def test_a_sigkilled_fit_resumes_bit_for_bit(tmp_path):
    path = tmp_path / "fit.ckpt"
    script = KILLED_FIT.format(tests=os.path.dirname(__file__), path=str(path))
    # this process's environment: with OMP_NUM_THREADS=1 for the killed process alone, torch 2.1's
    # one thread rounded otherwise than this one thread (restart losses 2e-14 apart); the script
    # takes one thread itself, as conftest.py does here
    process = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if path.exists():
                progress = saved_progress(path)
                if progress["stage"] == ["final", 0] and progress["run"]["iteration"] >= 5:
                    break
            time.sleep(0.05)
        assert process.poll() is None, "the fit ended before it could be killed"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    x, y = _data(n=300)
    build = lambda: make_model("fsard", 4, num_samples=64)  # noqa: E731
    resumed = _fit(build, x, y, checkpoint=path, **SIGKILL_SETTINGS)
    reference = _fit(build, x, y, **SIGKILL_SETTINGS)
    _assert_same_fit(resumed, reference)
    assert resumed[2] < reference[2] - 5  # restarts and the first iterations were not run again


def test_a_checkpoint_that_cannot_be_written_is_refused_before_the_fit(tmp_path):
    """The checkpoint path is checked for being writable, not only for a directory: a link into a missing
    directory (or a read-only directory) would fail at the first save, after the first stage's work,
    with a bare FileNotFoundError naming the temporary file."""
    x, y = _data()
    (tmp_path / "fit.ckpt").symlink_to(tmp_path / "gone" / "fit.ckpt")
    model = FeatureGP(None, None, FSARDKernel(4, 16, seed=0)).double()
    with pytest.raises(ValueError, match="cannot write checkpoint .*fit.ckpt: No such file or directory"):
        fit(model, x, y, checkpoint=tmp_path / "fit.ckpt", progress=False)
    assert model.covar_module.raw_lengthscale.grad is None  # no likelihood was evaluated


def _mid_run_checkpoint(tmp_path, monkeypatch, **settings):
    """The bytes of a checkpoint saved during the final optimisation, and the fit's arguments."""
    from alacarte._checkpoint import FitCheckpoint

    monkeypatch.setattr(training_stages, "CHECKPOINT_INTERVAL", 0.0)
    saved, save = [], FitCheckpoint.save

    def keep(self, progress):
        save(self, progress)
        if progress["stage"][0] == "final" and progress["run"]["iteration"] == 2:
            saved.append(self.path.read_bytes())

    monkeypatch.setattr(FitCheckpoint, "save", keep)
    x, y = _data(n=60)
    path = tmp_path / "fit.ckpt"
    fit(make_model("fsard", 4, num_samples=16, seed=0), x, y, checkpoint=path, progress=False, **settings)
    monkeypatch.undo()
    return saved[0], path, x, y


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_a_crafted_progress_is_refused_by_field_before_the_fit_resumes(optimizer, tmp_path, monkeypatch):
    """A checkpoint's key can be copied from a real one: its progress is checked against the fit too."""
    from alacarte._checkpoint import SIGNATURE
    from model_files import payload, with_payload

    settings = dict(optimizer=optimizer, max_iter=4, restarts=1, restart_iter=2)
    good, path, x, y = _mid_run_checkpoint(tmp_path, monkeypatch, **settings)
    first = 0 if optimizer == "lbfgs" else 4

    def edit_run(name, value):
        return lambda p: p["progress"]["run"].__setitem__(name, value)

    cases = [
        (lambda p: p["progress"].update(stage=["restart", 5]), r"progress\.stage\[1\]"),
        (lambda p: p["progress"].update(stage=["final", 0], run=None), r"progress\.run: expected a dict"),
        (edit_run("iteration", 10**9), r"progress\.run\.iteration"),
        (lambda p: p["progress"]["run"]["model"].pop("input_offset"), r"progress\.run\.model: does not fit"),
        (lambda p: p["progress"]["run"]["optimizer"]["param_groups"][0].update(lr=1e9),
         r"progress\.run\.optimizer\.param_groups"),
        (lambda p: p["progress"]["run"]["optimizer"]["state"].update({first: {"exp_avg": torch.zeros(9)}}),
         r"progress\.run\.optimizer\.state"),
        (edit_run("best", (3, {})), r"progress\.run\.best"),
        (lambda p: p["progress"]["history"].update(restart_losses=[]), r"progress\.history\.restart_losses"),
        (lambda p: p["progress"].update(rng={"bit_generator": "MT19937"}), r"progress\.rng"),
        (lambda p: p["progress"].update(seconds=torch.ones(2)), r"progress\.seconds"),
        (lambda p: p["key"].update(lr=torch.ones(2)), r"is of another fit .*lr"),
    ]
    for edit, message in cases:
        obj = payload(good, SIGNATURE)
        edit(obj)
        path.write_bytes(with_payload(good, SIGNATURE, obj))
        with pytest.raises(ValueError, match=f"checkpoint .*{message}"):
            fit(make_model("fsard", 4, num_samples=16, seed=0), x, y, checkpoint=path, progress=False, **settings)
    path.write_bytes(with_payload(good, SIGNATURE, payload(good, SIGNATURE)))  # the file itself resumes
    resumed = make_model("fsard", 4, num_samples=16, seed=0)
    fit(resumed, x, y, checkpoint=path, progress=False, **settings)
    uninterrupted = make_model("fsard", 4, num_samples=16, seed=0)
    fit(uninterrupted, x, y, progress=False, **settings)
    for name, value in uninterrupted.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name

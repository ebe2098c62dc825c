"""Saved models: one file, written atomically, reloaded bit for bit.

A model file holds everything a fitted model needs to predict — the kernel's
class and constructor configuration, every parameter and buffer (random
Fourier state, standardisation), the standardised training data and, for
feature models, the factorised weight posterior — plus the package and format
versions.  Layout::

    b"ALACARTE-MODEL\\n"  |  u32 header length  |  JSON header  |  body

The JSON header carries the format version, the alacarte and torch versions
and the body's length and SHA-256; the body is a ``torch.save`` archive of
tensors, numbers and strings only, read back with ``weights_only=True`` (no
pickled code runs on load).  A file from another format version, a truncated
or damaged file, or a file that is not an alacarte model gives a
``ValueError`` that says which.  The kernel's class is looked up in a closed
registry of alacarte's own kernels (no name from a file is imported), and every
field of the record — types, shapes against the model its configuration builds,
sizes against the tensors the file holds — is checked before anything is built:
a crafted record is a ``ValueError`` naming the field, not an allocation of
what it claims nor a failure in ``predict``.

Files hold CPU tensors; a loaded model is on the CPU (move it with ``.to(device)``).

Writes go to a temporary file in the target's directory, are flushed and
fsync'ed, and replace the target with one ``os.replace``: a crash mid-write
leaves the previous file as it was.

Example:
    >>> import numpy as np
    >>> from alacarte import AlaCarteRegressor
    >>> from alacarte.io import load_model, save_model
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-2, 2, (100, 2)); y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(100)
    >>> regressor = AlaCarteRegressor("fsard", num_samples=32, max_iter=20, restarts=0).fit(X, y)
    >>> path = save_model(regressor, "sine.alacarte")     # or a FeatureGP / ExactRBFGP
    >>> same = load_model(path)
    >>> np.array_equal(same.predict(X), regressor.predict(X))
    True
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gpytorch.constraints import Interval

from ._files import read_checked, refuse_unwritable, write_checked
from ._records import (
    DTYPES,
    KERNEL_CLASSES,
    check_built_model,
    check_choice,
    check_dict,
    check_kernel_record,
    check_list,
    check_matching_state,
    check_model_fields,
    check_permutations,
    check_posterior,
    check_regressor_record,
    check_state,
    check_values,
    constructor_names,
    elements,
    fail,
    kernel_name,
)
from .factory import default_dtype, floating_state
from .kernels import FeatureKernel
from .models import ExactRBFGP, FeatureGP
from .regressor import AlaCarteRegressor, selection_of
from .replicates import Replicates
from .training import FitHistory
from .woodbury import WoodburyPosterior

__all__ = ["FORMAT_VERSION", "save_model", "load_model", "load_with_metadata"]

MAGIC = b"ALACARTE-MODEL\n"
#: Version of the file layout; a reader refuses files of any other version. Version 2 stores raw
#: lengthscales as logarithms; version 1 stored them as softplus arguments.
FORMAT_VERSION = 2
_DTYPES = DTYPES
_PLAIN = (bool, int, float, str)

Model = FeatureGP | ExactRBFGP


# -- kernels ---------------------------------------------------------------------------
def _kernel_config(kernel: FeatureKernel) -> dict[str, Any]:
    """Constructor arguments that rebuild ``kernel``'s structure (its values come from the state dict)."""
    config: dict[str, Any] = {}
    for name in constructor_names(type(kernel)):
        value = getattr(kernel, name, None)
        if isinstance(value, _PLAIN):
            config[name] = value
    if kernel.ard_num_dims is not None:
        config["ard_num_dims"] = int(kernel.ard_num_dims)
    if len(kernel.batch_shape):
        config["batch_shape"] = list(kernel.batch_shape)
    if kernel.active_dims is not None:
        config["active_dims"] = kernel.active_dims.tolist()
    return config


def _kernel_record(kernel: FeatureKernel) -> dict[str, Any]:
    return {"class": kernel_name(type(kernel)), "config": _kernel_config(kernel)}


def _build_kernel(record: Any, field: str, budget: int) -> FeatureKernel:
    """The kernel ``record`` describes (checked first; ``budget``: elements the file's tensors hold)."""
    config = dict(check_kernel_record(record, field, budget))
    if "batch_shape" in config:
        config["batch_shape"] = torch.Size(config["batch_shape"])
    if "active_dims" in config:
        config["active_dims"] = torch.tensor(config["active_dims"])
    num_dims, num_samples = config.pop("num_dims"), config.pop("num_samples")
    # Kernels refuse ard_num_dims=1 for one shared lengthscale (GPyTorch reads it as the input width), but
    # files may hold it. Its lengthscale is (*batch, 1, 1), as with ard_num_dims=None, so such files
    # rebuild with None.
    if config.get("ard_num_dims") == 1 and num_dims > 1:
        del config["ard_num_dims"]
    try:
        return KERNEL_CLASSES[record["class"]](num_dims, num_samples, **config)
    except ValueError as err:
        raise ValueError(f"{field}.config: {err}") from None
    except (TypeError, RuntimeError) as err:  # e.g. sizes no kernel accepts together
        raise ValueError(f"{field}.config: {type(err).__name__}: {err}") from None


def _classes(module: torch.nn.Module) -> dict[str, str]:
    """The class of every submodule (of a constraint, with its transform): what a state dict cannot
    carry. A file rebuilds alacarte's own classes, so a user's mean, kernel or model subclass would
    come back as something else under the same keys."""
    classes = {}
    # (Every duplicate: GPyTorch's constraints share one Softplus, which a deep copy of a kernel duplicates.)
    for name, sub in module.named_modules(remove_duplicate=False):
        cls = type(sub)
        label = f"{cls.__module__}.{cls.__qualname__}"
        if isinstance(sub, Interval):
            transform = sub._transform
            label += "/" + (type(transform).__name__ if isinstance(transform, torch.nn.Module) else getattr(
                transform, "__qualname__", repr(transform)))
        classes[name or "the model"] = label
    return classes


def _refuse_unfaithful(original: torch.nn.Module, rebuilt: torch.nn.Module, state: dict[str, torch.Tensor],
                       what: str) -> None:
    """Refuse to save ``original`` when ``rebuilt`` (built from its record, whose state dict is
    ``state``) differs from it in a class or in a value."""
    have, get = _classes(original), _classes(rebuilt)
    differences = [f"{name}: {have.get(name, 'absent')}, rebuilt as {get.get(name, 'absent')}"
                   for name in dict.fromkeys([*have, *get]) if have.get(name) != get.get(name)]
    # Every tensor is rebuilt in the model's one dtype: a float64 kernel in a float32 model would be rounded.
    rebuilt_state = rebuilt.state_dict()
    differences += [f"{name}: {value.dtype}, rebuilt as {rebuilt_state[name].dtype}" for name, value in state.items()
                    if not torch.allclose(rebuilt_state[name].to(value.dtype), value, rtol=0, atol=0, equal_nan=True)]
    if differences:
        raise ValueError(
            f"{what} cannot be saved faithfully: a file would rebuild parts of it as another type "
            f"({'; '.join(differences)}); saved models hold alacarte's own models and kernels, with "
            "their default mean, likelihood and constraint types, in one dtype"
        )


# -- models ----------------------------------------------------------------------------
def _dtype_name(dtype: torch.dtype) -> str:
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"saved models support float32 and float64, got {dtype}")


def _cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU copies: files do not depend on the device the model was on."""
    return {k: v.detach().cpu().clone() for k, v in tensors.items()}


def _frozen(module: torch.nn.Module) -> list[str]:
    """Parameters excluded from training (e.g. ``learn_simplex_size=False``): a state dict does not say."""
    return [name for name, p in module.named_parameters() if not p.requires_grad]


def _load_state(module: torch.nn.Module, record: dict[str, Any]) -> None:
    module.load_state_dict(record["state_dict"])
    frozen = set(record.get("frozen", ()))
    for name, p in module.named_parameters():
        p.requires_grad_(name not in frozen)


def _model_record(model: Model) -> dict[str, Any]:
    if not isinstance(model, (FeatureGP, ExactRBFGP)):
        raise ValueError(f"save_model takes a FeatureGP, an ExactRBFGP or an AlaCarteRegressor, got {type(model).__name__}")
    record: dict[str, Any] = {"dtype": _dtype_name(model.input_offset.dtype), "num_dims": model.num_dims}
    if isinstance(model, FeatureGP):
        record["class"] = "FeatureGP"
        record["kernel"] = _kernel_record(model.covar_module)
    else:
        record["class"] = "ExactRBFGP"
        record["ard"] = model.covar_module.base_kernel.ard_num_dims is not None
    record["state_dict"] = _cpu(model.state_dict())
    record["frozen"] = _frozen(model)
    if model.train_inputs is not None:
        record.update(_cpu({"train_inputs": model.train_inputs[0], "train_targets": model.train_targets}))
    if isinstance(model, FeatureGP) and model._has_data():
        # The factor itself is stored: predictions after loading then do not depend on
        # re-running the O(nD²) factorisation bit for bit, and a model fitted on streamed
        # data (which holds its posterior but no rows) predicts after loading too.
        was_training = model.training
        model.eval()
        posterior = model.posterior()
        record["posterior"] = _cpu({"cholesky": posterior.cholesky, "weights": posterior.weights,
                                    "noise": posterior.noise})
        model.train(was_training)
    return record


def _build_model(record: Any, field: str = "record") -> Model:
    """The model ``record`` describes, every field checked before it is used."""
    budget = check_model_fields(record, field)
    dtype = _DTYPES[record["dtype"]]
    with default_dtype(dtype):
        if record["class"] == "FeatureGP":
            model = FeatureGP(None, None, _build_kernel(record["kernel"], f"{field}.kernel", budget))
            if model.num_dims != record["num_dims"]:
                fail(f"{field}.num_dims", f"{record['num_dims']}, but the kernel's is {model.num_dims}")
        else:
            model = ExactRBFGP(None, None, num_dims=record["num_dims"], ard=record["ard"])
    check_built_model(record, model, field)
    _load_state(model, record)
    if "train_inputs" in record:
        model.set_train_data(record["train_inputs"], record["train_targets"], strict=False)
    model.eval()
    if "posterior" in record:
        model._keep_posterior(WoodburyPosterior.from_factor(**record["posterior"]))
    return model


def _refuse_priors(module: torch.nn.Module, what: str) -> None:
    # A prior without buffers would vanish from the file unnoticed: none are saved.
    names = [name for name, *_ in module.named_priors()]
    if names:
        raise ValueError(f"{what} cannot be saved faithfully: it has priors ({', '.join(names)}); saved models "
                         "support alacarte kernels without priors")


def _check_rebuilds(model: Model, record: dict[str, Any]) -> None:
    """Refuse to write a file that would not load back into the same model."""
    _refuse_priors(model, "this model")
    try:
        # In the model's one dtype: a part in another is refused below, by name and value.
        dtype = _DTYPES[record["dtype"]]
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in record["state_dict"].items()}
        rebuilt = _build_model({k: v for k, v in record.items() if k != "posterior"} | {"state_dict": state})
        if "posterior" in record:  # (a file that its own reader would refuse is not written)
            check_posterior(record["posterior"], rebuilt.covar_module, "posterior")
    except (KeyError, RuntimeError, TypeError, ValueError) as err:
        raise ValueError(
            f"this model cannot be saved faithfully ({type(err).__name__}: {err}); saved models support "
            "alacarte kernels without priors"
        ) from err
    _refuse_unfaithful(model, rebuilt, record["state_dict"], "this model")


# -- estimators ------------------------------------------------------------------------
def _kernel_object_record(kernel: FeatureKernel) -> dict[str, Any]:
    _refuse_priors(kernel, "the estimator's kernel")
    record = {"object": _kernel_record(kernel), "dtype": _dtype_name(floating_state(kernel).dtype),
              "state_dict": _cpu(kernel.state_dict()), "frozen": _frozen(kernel)}
    try:
        rebuilt = _build_kernel_object(record)
    except (KeyError, RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"the estimator's kernel cannot be saved faithfully ({type(err).__name__}: {err})") from err
    _refuse_unfaithful(kernel, rebuilt, record["state_dict"], "the estimator's kernel")
    return record


def _build_kernel_object(record: Any, field: str = "record.params.kernel") -> FeatureKernel:
    check_dict(record, field, ("object", "dtype", "state_dict"), ("frozen",))
    check_choice(record["dtype"], _DTYPES, f"{field}.dtype")
    state = check_state(record["state_dict"], f"{field}.state_dict")
    frozen = check_list(record.get("frozen", []), f"{field}.frozen",
                        lambda v, f: isinstance(v, str) or fail(f, f"expected a parameter name, got {v!r:.80}"))
    with default_dtype(_DTYPES[record["dtype"]]):
        kernel = _build_kernel(record["object"], f"{field}.object", elements(state))
    check_matching_state(state, kernel.state_dict(), f"{field}.state_dict")
    for key, value in state.items():
        check_values(value, f"{field}.state_dict[{key!r}]")
    check_permutations(state, f"{field}.state_dict")
    parameters = dict(kernel.named_parameters())
    for i, name in enumerate(frozen):
        if name not in parameters:
            fail(f"{field}.frozen[{i}]", f"{name!r:.80} is not a parameter of the kernel")
    _load_state(kernel, record)
    return kernel


def _regressor_record(reg: AlaCarteRegressor) -> dict[str, Any]:
    if type(reg) is not AlaCarteRegressor:  # a file rebuilds an AlaCarteRegressor, without the subclass's code
        raise ValueError(f"{type(reg).__name__} cannot be saved faithfully: saved estimators are "
                         "AlaCarteRegressor itself, not subclasses")
    # A grid search passes numpy scalars, which a weights-only load refuses: files hold Python values.
    params = {name: value.item() if isinstance(value, np.generic) else value
              for name, value in reg.get_params().items()}
    if isinstance(params["kernel"], FeatureKernel):
        params["kernel"] = _kernel_object_record(params["kernel"])
    state = params["random_state"]
    # A RandomState object only matters for refitting; files hold plain values.
    params["random_state"] = int(state) if isinstance(state, (int, np.integer)) else None
    record: dict[str, Any] = {"params": params}
    if hasattr(reg, "model_"):
        model_record, *more = [_model_record(model) for model in reg.models_]
        for model, saved in zip(reg.models_, [model_record, *more]):
            _check_rebuilds(model, saved)
        record["fitted"] = {
            "model": model_record,
            "n_features_in_": int(reg.n_features_in_),
            "n_iter_": int(reg.n_iter_),
            "log_marginal_likelihood_": float(reg.log_marginal_likelihood_),
            "history": {k: v for k, v in vars(reg.history_).items()},
            "num_components_": int(reg.num_components_),
            "num_samples_": int(reg.num_samples_),
            "pilot_rows_": None if reg.pilot_rows_ is None else int(reg.pilot_rows_),
            "component_scores_": [[int(q), float(score)] for q, score in reg.component_scores_.items()],
        }
        if more:
            record["fitted"]["more_models"] = more
        if getattr(reg, "replicates_", None) is not None:
            reps = reg.replicates_
            record["fitted"]["replicates_"] = {"inputs": reps.inputs, "means": reps.means, "counts": reps.counts,
                                               "shares": reg.replicate_shares_}
        if hasattr(reg, "feature_names_in_"):
            record["fitted"]["feature_names_in_"] = [str(n) for n in reg.feature_names_in_]
    return record


def _build_regressor(record: Any) -> AlaCarteRegressor:
    check_regressor_record(record, AlaCarteRegressor._get_param_names())
    params = dict(record["params"])
    if isinstance(params["kernel"], dict):
        params["kernel"] = _build_kernel_object(params["kernel"])
    reg = AlaCarteRegressor(**params)
    fitted = record.get("fitted")
    if fitted is not None:
        reg.model_ = _build_model(fitted["model"], "record.fitted.model")
        reg.models_ = [reg.model_] + [_build_model(saved, f"record.fitted.more_models[{i}]")
                                      for i, saved in enumerate(fitted.get("more_models", []))]
        reg.history_ = FitHistory(**fitted["history"])
        reg.n_features_in_ = fitted["n_features_in_"]
        reg.n_iter_ = fitted["n_iter_"]
        reg.log_marginal_likelihood_ = fitted["log_marginal_likelihood_"]
        # A file without the choice holds an int num_components.
        reg.num_components_ = fitted.get("num_components_", params["num_components"])
        reg.component_scores_ = {q: score for q, score in fitted.get("component_scores_", [])}
        # A file without them was fitted with the named kernel's frequencies it holds, and with an int pilot or none.
        reg.num_samples_ = fitted.get("num_samples_", params["num_samples"])
        reg.pilot_rows_ = fitted.get("pilot_rows_", params.get("pilot_rows"))
        if "feature_names_in_" in fitted:
            reg.feature_names_in_ = np.asarray(fitted["feature_names_in_"], dtype=object)
        reps = fitted.get("replicates_")
        reg.replicates_ = None if reps is None else Replicates(reps["inputs"], reps["means"], reps["counts"])
        reg.replicate_shares_ = None if reps is None else list(reps["shares"])
        if params.get("select"):  # each draw's kernel holds its selection's zeros
            reg.selection_frequency_, reg.selected_ = selection_of(reg.models_)
    return reg


# -- files -----------------------------------------------------------------------------
def check_model_path(path: str | os.PathLike) -> Path:
    """``path`` as a :class:`~pathlib.Path` that :func:`save_model` can write; a ValueError if it names a
    directory or lies in a directory that does not exist or cannot be written to (the command line
    checks before it fits)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; save_model needs a file path, e.g. {path / 'model.alacarte'}")
    if not path.parent.is_dir():
        raise ValueError(f"cannot write {path}: the directory {path.parent} does not exist")
    refuse_unwritable(path)
    return path


def save_model(model: FeatureGP | ExactRBFGP | AlaCarteRegressor, path: str | os.PathLike,
               *, metadata: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (a fitted model or estimator) to ``path`` atomically.

    Args:
        model: a :class:`~alacarte.FeatureGP`, :class:`~alacarte.ExactRBFGP` or
            :class:`~alacarte.AlaCarteRegressor`.
        path: the file to (over)write.
        metadata: a dict with str keys and JSON-serialisable values (e.g. column names),
            returned by :func:`load_with_metadata`.

    Returns:
        ``path``, as a :class:`~pathlib.Path`.

    Raises:
        ValueError: if ``model`` is of another type or cannot be rebuilt from a file (a kernel
            with priors; a constraint, mean, kernel or model of another class than alacarte's
            own, e.g. a user's subclass; values in another dtype than the model's); ``path``
            is a directory or its directory is missing or not writable; ``metadata`` is not a
            JSON-serialisable dict with str keys.
    """
    from . import __version__

    path = check_model_path(path)
    # (Anything else would come back otherwise: [] as {}, {1: x} as {"1": x}; a str breaks the command line.)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(k, str) for k in metadata)):
        raise ValueError(f"metadata must be a dict with str keys, got {metadata!r:.80}")
    try:
        metadata_json = json.dumps(metadata or {})
    except (TypeError, ValueError) as err:
        raise ValueError(f"metadata must be JSON-serialisable (dicts, lists, str, numbers, bools, None): {err}") from None
    if isinstance(model, AlaCarteRegressor):
        kind, record = "AlaCarteRegressor", _regressor_record(model)
    else:
        kind, record = "model", _model_record(model)
        _check_rebuilds(model, record)
    write_checked(path, MAGIC, {
        "format_version": FORMAT_VERSION,
        "alacarte_version": __version__,
        "torch_version": torch.__version__,
        "kind": kind,
        "metadata": json.loads(metadata_json),
    }, {"kind": kind, "record": record, "metadata": json.loads(metadata_json)})  # (checksummed, unlike the header)
    return path


def _read(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    header, payload = read_checked(Path(path), MAGIC, FORMAT_VERSION, "alacarte model file")
    if not (isinstance(payload, dict) and isinstance(payload.get("record"), dict)):
        raise ValueError(f"{path} is damaged: its data are not an alacarte model record")
    return header, payload


def _json(value: Any) -> str | None:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):  # a checksummed copy holding what no header can
        return None


def load_with_metadata(path: str | os.PathLike) -> tuple[FeatureGP | ExactRBFGP | AlaCarteRegressor, dict[str, Any]]:
    """:func:`load_model` plus the ``metadata`` given to :func:`save_model`.

    Returns:
        ``(model, metadata)``; ``metadata`` is ``{}`` when none was given.

    Raises:
        ValueError: as for :func:`load_model`.
    """
    from . import __version__

    header, payload = _read(path)
    metadata = header.get("metadata", {})
    # The header, readable without torch, is not under the checksum: a damaged byte in it could rename
    # a column the command line then reads. The body holds a checksummed copy (where a file has one:
    # some hold only the header's). Compared as JSON text, where NaN equals NaN.
    if "metadata" in payload and _json(payload["metadata"]) != _json(metadata):
        raise ValueError(f"{path} is damaged: the metadata in its header differ from their checksummed copy")
    build = _build_regressor if payload.get("kind") == "AlaCarteRegressor" else _build_model
    try:
        obj = build(payload["record"])
    except ValueError as err:
        # A checksummed file this version cannot rebuild: written by another alacarte, or by hand.
        raise ValueError(f"{path} holds a model this alacarte ({__version__}) cannot rebuild: {err}") from None
    return obj, metadata


def load_model(path: str | os.PathLike) -> FeatureGP | ExactRBFGP | AlaCarteRegressor:
    """Read a model written by :func:`save_model`; it predicts bit for bit as the saved one.

    Raises:
        ValueError: the file is not an alacarte model, has another format
            version, or is truncated or damaged.
    """
    return load_with_metadata(path)[0]

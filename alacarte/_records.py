"""What a saved model's record may hold, checked before anything is built from it.

A model file names classes only from the closed registries here — alacarte's own
kernels (:data:`KERNEL_CLASSES`) and models (:data:`MODEL_CLASSES`); the mean and
likelihood are always GPyTorch's ``ConstantMean`` and ``GaussianLikelihood``,
which :func:`alacarte.io.save_model` refuses to replace.  No name read from a
file is imported.

Every field is checked against its type and against the sizes the record's own
tensors can hold: a kernel's ``num_samples`` that no stored tensor is large
enough for, a state dict whose shapes differ from the model its configuration
builds, a truncated posterior — each is a ``ValueError`` naming the field (e.g.
``record.kernel.config.num_samples``), raised before memory is allocated for it.
"""
from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from .factory import AUTO_DRAWS, FEATURE_KERNEL_CLASSES
from .kernels import FeatureKernel

__all__ = ["KERNEL_CLASSES", "MODEL_CLASSES", "kernel_class", "kernel_name"]

#: The kernel classes a model file may name, by the name files spell them with: those the factory builds.
KERNEL_CLASSES: dict[str, type] = {f"{cls.__module__}:{cls.__name__}": cls for cls in FEATURE_KERNEL_CLASSES}
#: The model classes a model file may name.
MODEL_CLASSES = ("FeatureGP", "ExactRBFGP")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
# Configuration entries that size a kernel: each must fit in the record's tensors.
_SIZES = ("num_dims", "num_samples", "num_components", "ard_num_dims")
_FLOATS = (torch.float32, torch.float64)


def fail(field: str, problem: str):
    raise ValueError(f"{field}: {problem}")


def kernel_class(name: Any, field: str) -> type:
    """The registered kernel class a file names (a ValueError naming ``field`` for any other)."""
    cls = KERNEL_CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        fail(field, f"{name!r:.120} is not one of alacarte's kernel classes ({', '.join(sorted(KERNEL_CLASSES))})")
    return cls


def kernel_name(cls: type) -> str:
    """The name a file gives the kernel class ``cls``; a ValueError when files cannot hold it."""
    for name, registered in KERNEL_CLASSES.items():
        if registered is cls:
            return name
    raise ValueError(f"a {cls.__name__} cannot be saved faithfully: saved models hold alacarte's own kernels "
                     f"({', '.join(c.__name__ for c in KERNEL_CLASSES.values())}), not subclasses")


def constructor_names(cls: type) -> list[str]:
    """Keyword names accepted along the FeatureKernel part of ``cls``'s MRO."""
    names: list[str] = []
    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, FeatureKernel)) or "__init__" not in vars(klass):
            continue
        for name, param in inspect.signature(klass.__init__).parameters.items():
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) and name != "self":
                if not name.endswith(("_prior", "_constraint")) and name not in names:
                    names.append(name)
    return names


# -- values -----------------------------------------------------------------------------
def check_dict(value: Any, field: str, required=(), optional=()) -> dict:
    """``value`` as a dict with str keys, holding every ``required`` key and no key outside both lists."""
    if not isinstance(value, dict):
        fail(field, f"expected a dict, got {type(value).__name__}")
    allowed = set(required) | set(optional)
    for key in value:
        if not isinstance(key, str) or key not in allowed:
            fail(field, f"unexpected entry {key!r:.80}")
    for key in required:
        if key not in value:
            fail(field, f"the entry {key!r} is missing")
    return value


def check_choice(value: Any, choices, field: str) -> str:
    if not (isinstance(value, str) and value in choices):
        fail(field, f"expected one of {', '.join(choices)}, got {value!r:.80}")
    return value


def check_int(value: Any, field: str, low: int = 0, high: float = math.inf) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        fail(field, f"expected an integer in [{low}, {high}], got {value!r:.80}")
    return value


def check_float(value: Any, field: str, *, allow_none: bool = False, finite: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (finite and not math.isfinite(value)):
        fail(field, f"expected a {'finite ' if finite else ''}number, got {value!r:.80}")
    return value


def check_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        fail(field, f"expected True or False, got {value!r:.80}")
    return value


def check_list(value: Any, field: str, check, max_length: float = math.inf) -> list:
    """``value`` as a list (a tuple too) of at most ``max_length`` items, each passed to ``check(item, field)``."""
    if not isinstance(value, (list, tuple)) or len(value) > max_length:
        fail(field, f"expected a list of at most {max_length} items, got {type(value).__name__}")
    for i, item in enumerate(value):
        check(item, f"{field}[{i}]")
    return list(value)


def check_tensor(value: Any, field: str, shape: tuple | None = None, dtypes=_FLOATS) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.dtype not in dtypes:
        fail(field, f"expected a dense tensor of {', '.join(map(str, dtypes))}, got {type(value).__name__}"
             + (f" of {value.dtype}" if isinstance(value, torch.Tensor) else ""))
    if shape is not None and tuple(value.shape) != tuple(shape):
        fail(field, f"expected shape {tuple(shape)}, got {tuple(value.shape)}")
    return value


def check_state(value: Any, field: str) -> dict[str, torch.Tensor]:
    """A state dict: str keys, dense tensor values."""
    if not isinstance(value, dict):
        fail(field, f"expected a state dict, got {type(value).__name__}")
    for key, tensor in value.items():
        if not isinstance(key, str):
            fail(field, f"a key is not a str: {key!r:.80}")
        check_tensor(tensor, f"{field}[{key!r}]", dtypes=(*_FLOATS, torch.int64, torch.bool))
    return value


def elements(*tensors) -> int:
    """Elements in the tensors (and state dicts of tensors) given: what a record's sizes must fit in."""
    total = 0
    for item in tensors:
        if isinstance(item, dict):
            total += elements(*item.values())
        elif isinstance(item, torch.Tensor):
            total += item.numel()
    return total


def check_matching_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], field: str) -> None:
    """``state`` (from a file) has exactly the keys, shapes and dtypes of ``expected`` (the built module's),
    but for a model's ``band_scale``, which a state may leave out (loading fills in 1)."""
    missing = [k for k in expected if k not in state and k.split(".")[-1] != "band_scale"]
    extra = [k for k in state if k not in expected]
    if missing or extra:
        fail(field, f"does not fit the model its configuration builds (missing {missing[:5]}, unexpected {extra[:5]})")
    for key, value in expected.items():
        if key in state:
            check_tensor(state[key], f"{field}[{key!r}]", tuple(value.shape), (value.dtype,))


# -- records ----------------------------------------------------------------------------
def _check_size_list(value: Any, field: str, budget: int) -> list[int]:
    return check_list(value, field, lambda v, f: check_int(v, f, 1, budget), max_length=8)


def check_kernel_record(record: Any, field: str, budget: int) -> dict[str, Any]:
    """The kernel's constructor arguments, every size bounded by ``budget`` (elements the record's
    tensors hold): a kernel with more random features than the file stores cannot be the one saved."""
    check_dict(record, field, ("class", "config"))
    cls = kernel_class(record["class"], f"{field}.class")
    names = constructor_names(cls)
    config = check_dict(record["config"], f"{field}.config", ("num_dims", "num_samples"),
                        [*names, "ard_num_dims", "batch_shape", "active_dims"])
    where = f"{field}.config"
    for key, value in config.items():
        if key in _SIZES:
            check_int(value, f"{where}.{key}", 1, budget)
        elif key == "batch_shape":
            _check_size_list(value, f"{where}.{key}", budget)
        elif key == "active_dims":
            check_list(value, f"{where}.{key}", lambda v, f: check_int(v, f, 0, budget), max_length=budget)
        elif key == "seed":
            if value is not None:
                check_int(value, f"{where}.seed", 0, 2**64 - 1)
        elif key in ("simplex", "learn_simplex_size"):
            check_bool(value, f"{where}.{key}")
        elif key == "strategy":
            if not isinstance(value, str):
                fail(f"{where}.strategy", f"expected a str, got {value!r:.80}")
        else:
            check_float(value, f"{where}.{key}", allow_none=True, finite=True)
    features = config["num_samples"] * config.get("num_components", 1) * math.prod(config.get("batch_shape", []))
    if features > budget:
        fail(where, f"{features} random features (num_samples × num_components × batch) are more than the "
                    f"{budget} numbers the record's tensors hold")
    return config


def check_model_fields(record: Any, field: str) -> int:
    """The plain fields of a model record; returns the elements its tensors hold."""
    check_dict(record, field, ("dtype", "num_dims", "class", "state_dict"),
               ("kernel", "ard", "frozen", "train_inputs", "train_targets", "posterior"))
    check_choice(record["class"], MODEL_CLASSES, f"{field}.class")
    check_choice(record["dtype"], DTYPES, f"{field}.dtype")
    check_state(record["state_dict"], f"{field}.state_dict")
    for name in ("train_inputs", "train_targets"):
        if name in record:
            check_tensor(record[name], f"{field}.{name}")
    if ("train_inputs" in record) != ("train_targets" in record):
        fail(field, "holds one of train_inputs and train_targets without the other")
    budget = elements(record["state_dict"], record.get("train_inputs"), record.get("train_targets"),
                      record.get("posterior") if isinstance(record.get("posterior"), dict) else None)
    check_int(record["num_dims"], f"{field}.num_dims", 1, budget)
    check_list(record.get("frozen", []), f"{field}.frozen",
               lambda v, f: isinstance(v, str) or fail(f, f"expected a parameter name, got {v!r:.80}"))
    if record["class"] == "FeatureGP":
        if "ard" in record:
            fail(field, "a FeatureGP record holds no 'ard' entry")
        if "kernel" not in record:
            fail(field, "the entry 'kernel' is missing")
    else:
        if "kernel" in record or "posterior" in record:
            fail(field, "an ExactRBFGP record holds no kernel or posterior")
        check_bool(record.get("ard"), f"{field}.ard")
    return budget


def check_values(tensor: torch.Tensor, field: str, *, finite: bool = False, positive: bool = False) -> None:
    """No NaN (which no fitted model holds), and where asked no infinity and no value ≤ 0 (a raw
    parameter may be −∞: σ² set at its bound)."""
    if not tensor.is_floating_point():
        return
    if bool(torch.isnan(tensor).any()) or (finite and not bool(torch.isfinite(tensor).all())):
        fail(field, f"holds {'NaN' if bool(torch.isnan(tensor).any()) else 'an infinite value'}")
    if positive and not bool((tensor > 0).all()):
        fail(field, "holds a value ≤ 0")


def check_permutations(state: dict[str, torch.Tensor], field: str) -> None:
    """Fastfood's ``perm`` buffers index their blocks: each row must be a permutation."""
    for key, value in state.items():
        if key.split(".")[-1] == "perm" and value.numel():
            if not torch.equal(value.sort(-1).values, torch.arange(value.shape[-1]).expand_as(value)):
                fail(f"{field}[{key!r}]", "a row is not a permutation")


def check_built_model(record: dict[str, Any], model: torch.nn.Module, field: str) -> None:
    """Everything of ``record`` that depends on the model its configuration built."""
    state = record["state_dict"]
    check_matching_state(state, model.state_dict(), f"{field}.state_dict")
    parameters = dict(model.named_parameters())
    for key, value in state.items():
        standardisation = key in ("input_offset", "input_scale", "target_offset", "target_scale")
        check_values(value, f"{field}.state_dict[{key!r}]", finite=standardisation, positive=key.endswith("_scale"))
        if key in parameters and bool((value == math.inf).any()):  # (raw −∞ sits at the bound; +∞ predicts nothing)
            fail(f"{field}.state_dict[{key!r}]", "holds +inf")
    check_permutations(state, f"{field}.state_dict")
    for i, name in enumerate(record.get("frozen", [])):
        if name not in parameters:
            fail(f"{field}.frozen[{i}]", f"{name!r:.80} is not a parameter of the model")
    dtype, num_dims = model.input_offset.dtype, model.input_offset.shape[-1]
    if "train_inputs" in record:
        inputs = check_tensor(record["train_inputs"], f"{field}.train_inputs", dtypes=(dtype,))
        if inputs.dim() != 2 or inputs.shape[1] != num_dims or inputs.shape[0] < 1:
            fail(f"{field}.train_inputs", f"expected shape (n ≥ 1, {num_dims}), got {tuple(inputs.shape)}")
        check_tensor(record["train_targets"], f"{field}.train_targets", (inputs.shape[0],), (dtype,))
        check_values(inputs, f"{field}.train_inputs", finite=True)
        check_values(record["train_targets"], f"{field}.train_targets", finite=True)
    if "posterior" in record:
        check_posterior(record["posterior"], model.covar_module, f"{field}.posterior")


def check_posterior(posterior: Any, kernel, field: str) -> None:
    """The stored factor, weights and noise of a feature model's posterior fit its kernel's features."""
    check_dict(posterior, field, ("cholesky", "weights", "noise"))
    batch, features = tuple(kernel.batch_shape), kernel.num_features
    cholesky = check_tensor(posterior["cholesky"], f"{field}.cholesky", (*batch, features, features))
    check_tensor(posterior["weights"], f"{field}.weights", (*batch, features), (cholesky.dtype,))
    check_tensor(posterior["noise"], f"{field}.noise", batch, (cholesky.dtype,))
    for name in ("cholesky", "weights"):
        check_values(posterior[name], f"{field}.{name}", finite=True)
    check_values(posterior["noise"], f"{field}.noise", finite=True, positive=True)


def check_history(history: Any, field: str) -> dict[str, Any]:
    """A :class:`~alacarte.training.FitHistory`'s fields."""
    floats = ("loss", "restart_losses", "validation_loss")
    optional = ("chosen_restart", "noise_refit_loss", "best_iteration", "held_out_noise", "held_out_scale",
                "final_loss")
    check_dict(history, field, optional=(*floats, *optional, "seconds", "converged", "optimizer", "held_out_rows"))
    for name, value in history.items():
        where = f"{field}.{name}"
        if name in floats:
            check_list(value, where, check_float)
        elif name in ("chosen_restart", "best_iteration", "held_out_rows"):
            if value is not None or name == "held_out_rows":
                check_int(value, where)
        elif name == "converged":
            check_bool(value, where)
        elif name == "optimizer":
            check_choice(value, ("lbfgs", "adam"), where)
        else:
            check_float(value, where, allow_none=name != "seconds")
    return history


def check_regressor_record(record: Any, param_names: list[str]) -> None:
    """An estimator's parameters (plain values; ``fit`` checks them) and, when fitted, what it learned."""
    check_dict(record, "record", ("params",), ("fitted",))
    params = check_dict(record["params"], "record.params", ("kernel",), param_names)
    for name, value in params.items():
        plain = value is None or isinstance(value, (bool, int, float, str))
        if not (plain or (name == "kernel" and isinstance(value, dict))):
            fail(f"record.params.{name}", f"expected a plain value, got {type(value).__name__}")
    if "fitted" not in record:
        return
    fitted = check_dict(record["fitted"], "record.fitted",
                        ("model", "n_features_in_", "n_iter_", "log_marginal_likelihood_", "history"),
                        ("feature_names_in_", "more_models", "num_components_", "num_samples_", "pilot_rows_",
                         "component_scores_", "replicates_"))
    check_int(fitted["n_iter_"], "record.fitted.n_iter_")
    check_float(fitted["log_marginal_likelihood_"], "record.fitted.log_marginal_likelihood_")
    check_history(fitted["history"], "record.fitted.history")
    n_features = check_int(fitted["n_features_in_"], "record.fitted.n_features_in_", 1)
    model = fitted["model"]
    width = model.get("num_dims") if isinstance(model, dict) else None
    if not (type(width) is int and width == n_features):  # (width: whatever the file holds)
        fail("record.fitted.n_features_in_", f"{n_features}, but the model's num_dims is {width!r:.20}")
    more = check_list(fitted.get("more_models", []), "record.fitted.more_models",
                      lambda v, f: isinstance(v, dict) and type(v.get("num_dims")) is int and v["num_dims"] == width
                      or fail(f, f"expected a model record with num_dims {width}"))
    draws = params.get("num_draws", 1)
    counts = (1, AUTO_DRAWS) if draws == "auto" else (draws,) if type(draws) is int else ()  # "auto": as resolved
    if len(more) + 1 not in counts:
        fail("record.fitted.more_models", f"{len(more)} models, but the estimator's num_draws is {draws!r:.20}")
    for name in ("num_components_", "num_samples_"):
        if name in fitted:
            check_int(fitted[name], f"record.fitted.{name}", 1)
    if fitted.get("pilot_rows_") is not None:
        check_int(fitted["pilot_rows_"], "record.fitted.pilot_rows_", 1)
    check_list(fitted.get("component_scores_", []), "record.fitted.component_scores_",
               lambda v, f: (isinstance(v, list) and len(v) == 2 and type(v[0]) is int and isinstance(v[1], float))
               or fail(f, f"expected a [components, score] pair, got {v!r:.80}"))
    if "replicates_" in fitted:
        check_replicates(fitted["replicates_"], "record.fitted.replicates_", width, len(more) + 1)
    if "feature_names_in_" in fitted:
        names = check_list(fitted["feature_names_in_"], "record.fitted.feature_names_in_",
                           lambda v, f: isinstance(v, str) or fail(f, f"expected a str, got {v!r:.80}"))
        if len(names) != width:
            fail("record.fitted.feature_names_in_", f"expected {width} names, got {len(names)}")


def check_replicates(record: Any, field: str, width: int, draws: int) -> None:
    """The distinct training inputs (G, width) with their mean targets and counts ≥ 1, and each draw's σ²/ν in (0, 1]."""
    check_dict(record, field, ("inputs", "means", "counts", "shares"))
    inputs = check_tensor(record["inputs"], f"{field}.inputs", dtypes=(torch.float64,))
    if inputs.dim() != 2 or inputs.shape[1] != width:
        fail(f"{field}.inputs", f"expected shape (G, {width}), got {tuple(inputs.shape)}")
    check_values(inputs, f"{field}.inputs", finite=True)
    check_values(check_tensor(record["means"], f"{field}.means", (len(inputs),), (torch.float64,)),
                 f"{field}.means", finite=True)
    counts = check_tensor(record["counts"], f"{field}.counts", (len(inputs),), (torch.int64,))
    if not bool((counts >= 1).all()):
        fail(f"{field}.counts", "holds a count below 1")
    shares = check_list(record["shares"], f"{field}.shares",
                        lambda v, f: isinstance(v, float) and 0 < v <= 1
                        or fail(f, f"expected a number in (0, 1], got {v!r:.80}"))
    if len(shares) != draws:
        fail(f"{field}.shares", f"expected one per draw ({draws}), got {len(shares)}")

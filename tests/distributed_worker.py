"""One process of the data-parallel tests (tests/test_distributed.py starts two).

Usage: python distributed_worker.py SCENARIO[,SCENARIO...] OUT_DIR, with MASTER_ADDR, MASTER_PORT,
RANK and WORLD_SIZE set.  Writes OUT_DIR/SCENARIO/rank{RANK}.pt: the results, or the error.
"""
import os
import sys
import time
import traceback

import gpytorch
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import alacarte.distributed as ad  # noqa: E402
import alacarte.training._optimization as optimization  # noqa: E402
import alacarte.training._stages as stages  # noqa: E402
from alacarte._checkpoint import saved_progress  # noqa: E402
from alacarte.streaming import ChunkedData, streamed_negative_mll  # noqa: E402
from streaming_case import AugmentedChunks, make_case  # noqa: E402


class Killed(Exception):
    pass


class PlainGP(gpytorch.models.ExactGP):
    def __init__(self):
        super().__init__(None, None, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module, self.covar_module = gpytorch.means.ConstantMean(), gpytorch.kernels.RBFKernel()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def resume_from_checkpoint(x, y, path: str) -> dict:
    """An uninterrupted fit, and the same fit killed at its 6th evaluation (in restart 1: L-BFGS spends about one
    per iteration) on every process and resumed."""
    settings = dict(chunk_size=7, restarts=2, restart_iter=2, max_iter=6, progress=False)
    model = make_case()[2]
    ad.fit(model, x, y, **settings)
    result = {"reference": {k: v.clone() for k, v in model.state_dict().items()}}
    stages.CHECKPOINT_INTERVAL = 0.0
    evaluate, calls = optimization.negative_mll, [0]

    def killed_at_the_sixth(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 6:
            raise Killed
        return evaluate(*args, **kwargs)

    optimization.negative_mll = killed_at_the_sixth
    try:
        ad.fit(make_case()[2], x, y, checkpoint=path, **settings)
    except Killed:
        result["killed"] = True
    finally:
        optimization.negative_mll = evaluate
    result["saved_stage"] = saved_progress(path)["stage"]
    model = make_case()[2]
    ad.fit(model, x, y, checkpoint=path, **settings)
    result["resumed"] = {k: v.clone() for k, v in model.state_dict().items()}
    return result


def main() -> None:
    """Each scenario of the comma-separated list in turn, in one process group; a scenario's results and files
    go to OUT_DIR/SCENARIO."""
    scenarios, out_dir = sys.argv[1].split(","), sys.argv[2]
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    try:
        ad.init(timeout=float(os.environ.get("ALACARTE_TEST_TIMEOUT", "20")))
    except Exception as err:
        failed = {"error": f"{type(err).__name__}: {err}\n{traceback.format_exc()}"}
    else:
        failed = None
    for i, scenario in enumerate(scenarios):
        if i and failed is None:  # each scenario starts with every process past the one before
            torch.distributed.barrier()
        folder = os.path.join(out_dir, scenario)
        os.makedirs(folder, exist_ok=True)
        torch.save(failed or run(scenario, rank, folder), os.path.join(folder, f"rank{rank}.pt"))


def run(scenario: str, rank: int, out_dir: str) -> dict:
    result = {}
    try:
        x, y, model = make_case(seed=rank * (2**64 - 1) if scenario == "seed" else 0)
        rows = ad.shard(len(x))
        if scenario == "dtype" and rank == 1:  # rank 1's model in float32, rank 0's in float64
            model = model.float()
        ad.check_identical_state(model)
        if scenario == "checkpoint":
            result.update(resume_from_checkpoint(x[rows], y[rows], os.path.join(out_dir, "fit.ckpt")))
            raise SystemExit
        if scenario == "empty":  # rank 1 holds no rows
            ad.fit(model, x[rows] if rank == 0 else x[:0], y[rows] if rank == 0 else y[:0], progress=False)
        if scenario == "bad rows":  # rank 1's rows fail only when read: a NaN, another column count, none at all
            x_nan = x[rows].clone()
            x_nan[3, 0] = float("nan")
            bad = {"nan": (x_nan, y[rows]),
                   "columns": (torch.cat([x[rows], x[rows, :1]], 1), y[rows]), "none": ([], None)}
            for case, (x_bad, y_bad) in bad.items():
                try:
                    ad.fit(model, x_bad if rank == 1 else x[rows], y_bad if rank == 1 else y[rows], chunk_size=7,
                           restarts=0, max_iter=2, progress=False)
                except Exception as err:
                    result[case] = f"{type(err).__name__}: {err}"
            reads = []  # a checkpoint path that cannot be written is refused before any row is read

            class Chunks:
                def __iter__(self):
                    reads.append(1)
                    yield x[rows], y[rows]

            try:
                ad.fit(model, Chunks(), checkpoint=os.path.join(out_dir, "missing", "fit.ckpt"), progress=False)
            except ValueError as err:
                result["path"] = (str(err), len(reads))
            raise SystemExit
        if scenario == "frozen":  # rank 0 freezes the noise, rank 1 the mean constant (one number each)
            frozen = model.likelihood.noise_covar.raw_noise if rank == 0 else model.mean_module.raw_constant
            frozen.requires_grad_(False)
            ad.fit(model, x[rows], y[rows], chunk_size=7, restarts=0, max_iter=3, progress=False)
            result["state"] = {k: v.clone() for k, v in model.state_dict().items()}
            raise SystemExit
        if scenario == "settings":  # rank 1 asks for another step size and statistics dtype
            try:
                ad.fit(model, x[rows], y[rows], chunk_size=7, optimizer="adam", restarts=0, max_iter=5,
                       lr=0.2 if rank == 1 else None, statistics_dtype=torch.float32 if rank == 1 else None,
                       progress=False)
            except Exception as err:
                result["error"] = f"{type(err).__name__}: {err}"
            try:  # a GPyTorch model of no alacarte class: fit's own refusal, not an AttributeError
                ad.fit(PlainGP(), x[rows], y[rows], restarts=0, max_iter=2, progress=False)
            except Exception as err:
                result["plain"] = f"{type(err).__name__}: {err}"
            raise SystemExit
        if scenario == "restarts":  # 3 processes of 21, 20 and 20 rows
            result["sample"] = ChunkedData(x[rows], y[rows], chunk_size=7, distributed=True).sample(model, 25)
            history = ad.fit(model, x[rows], y[rows], chunk_size=7, restarts=2, restart_iter=2, max_iter=3,
                             progress=False)
            result["restart_losses"], result["fit_loss"] = history.restart_losses, history.loss
            result["state"] = {k: v.clone() for k, v in model.state_dict().items()}
            raise SystemExit
        if scenario == "checkpoint on one":  # only rank 1's checkpoint path cannot be written
            name = os.path.join(out_dir, "missing" if rank == 1 else "", f"fit{rank}.ckpt")
            try:
                ad.fit(model, x[rows], y[rows], checkpoint=name, restarts=0, max_iter=2, progress=False)
            except Exception as err:
                result["error"] = f"{type(err).__name__}: {err}"
            raise SystemExit
        if scenario == "augmented":  # rank 1's rows change between the two passes of an evaluation
            source = AugmentedChunks(x[rows], y[rows], 1e-6 if rank == 1 else 0.0)
            streamed_negative_mll(model.train(), ChunkedData(source, chunk_size=7, distributed=True))
        if scenario == "rounding" and rank == 1:  # as on a CPU whose BLAS rounds otherwise
            from alacarte.mll import WoodburyMarginalLogLikelihood

            exact = WoodburyMarginalLogLikelihood.from_statistics
            WoodburyMarginalLogLikelihood.from_statistics = lambda *a, **k: exact(*a, **k) * (1 + 1e-12)
        if scenario == "dead" and rank == 1:
            os._exit(3)  # a peer that dies in the middle of training
        if scenario == "dead":
            time.sleep(1.0)
        data = ChunkedData(x[rows], y[rows], chunk_size=7, distributed=True)
        model.train()
        loss = streamed_negative_mll(model, data)
        result["loss"] = loss
        result["grads"] = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad()
        history = ad.fit(model, x[rows], y[rows], chunk_size=7, restarts=0, max_iter=6, progress=False)
        result["fit_loss"] = history.loss
        result["state"] = {k: v.clone() for k, v in model.state_dict().items()}
        result["prediction"] = model.predict(x[:5]).mean
        # Restarts initialise from all processes' first rows: every process must continue from the same point.
        ad.fit(model, ChunkedData(x[rows], y[rows], chunk_size=7), restarts=2, restart_iter=2, max_iter=2)
        result["restarted_state"] = {k: v.clone() for k, v in model.state_dict().items()}
    except SystemExit:
        pass
    except Exception as err:  # reported to the test, which checks the message
        result["error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
    return result


if __name__ == "__main__":
    main()

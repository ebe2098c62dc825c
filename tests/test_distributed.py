"""Data-parallel training over two gloo processes on localhost equals one process."""
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import alacarte
import alacarte.distributed
from alacarte.streaming import ChunkedData, streamed_negative_mll
from streaming_case import make_case

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(scenario: str, tmp_path, ranks=(0, 1), world_size: int = 2, timeout: float = 20, wall: float = 120):
    """Start the worker processes, wait at most ``wall`` seconds; returns ({rank: result}, seconds)."""
    results, seconds = _launch_all([scenario], tmp_path, ranks, world_size, timeout, wall)
    return results[scenario], seconds


def _launch_all(scenarios: list[str], tmp_path, ranks=(0, 1), world_size: int = 2, timeout: float = 20,
                wall: float = 120):
    """The scenarios run one after another in one process group: ({scenario: {rank: result}}, seconds)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world_size),
               ALACARTE_TEST_TIMEOUT=str(timeout), OMP_NUM_THREADS="1")
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, WORKER, ",".join(scenarios), str(tmp_path)], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in ranks]
    try:
        outputs = [p.communicate(timeout=wall)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    seconds = time.perf_counter() - start
    results = {}
    for scenario in scenarios:
        results[scenario] = {}
        for r, out in zip(ranks, outputs):
            path = tmp_path / scenario / f"rank{r}.pt"
            results[scenario][r] = torch.load(path, weights_only=False) if path.exists() else {"exit": out}
    return results, seconds


# The scenarios in which every process is to raise the same error run in one process group.
REFUSALS = ["seed", "dtype", "frozen", "settings", "empty", "bad rows", "checkpoint on one", "augmented"]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    return _launch_all(REFUSALS, tmp_path_factory.mktemp("refusals"))[0]


def _close(a, b, tol=1e-10):
    return torch.allclose(a, b, rtol=tol, atol=tol)


def test_shards_cover_the_rows_once():
    for n, world in ((10, 3), (2, 2), (7, 1), (5, 5)):
        shards = [alacarte.distributed.shard(n, rank, world) for rank in range(world)]
        assert [i for s in shards for i in range(n)[s]] == list(range(n))
        assert max(s.stop - s.start for s in shards) - min(s.stop - s.start for s in shards) <= 1


@pytest.mark.parametrize("num_rows, rank, world_size, message", [
    (10, 0, 0, "world_size must be a positive integer"),
    (10, 3, 3, "rank must be below world_size = 3, got 3"),
    (10, -1, 3, "rank must be a non-negative integer"),
    (-1, 0, 2, "num_rows must be a non-negative integer"),
    (3, 0, 5, "3 rows cannot be sharded over 5 processes: each needs at least one"),
])
def test_impossible_shards_are_refused(num_rows, rank, world_size, message):
    with pytest.raises(ValueError, match=message):
        alacarte.distributed.shard(num_rows, rank, world_size)


@pytest.mark.parametrize("timeout", [0, -5.0, float("nan"), float("inf")])
def test_impossible_timeouts_are_refused(timeout):
    """torch takes 0 and −5 for timeouts (every process then fails to connect 'after -5000ms'), NaN and ∞
    fail in timedelta ('cannot convert float NaN to integer', OverflowError): refused first."""
    with pytest.raises(ValueError, match="timeout must be a finite number in"):
        alacarte.distributed.init(timeout=timeout)


def test_two_gloo_processes_equal_one_process(tmp_path):
    results, _ = _launch("fit", tmp_path)
    for r in (0, 1):
        assert "error" not in results[r] and "exit" not in results[r], results[r]

    x, y, model = make_case()
    model.train()
    loss = streamed_negative_mll(model, ChunkedData(x, y, chunk_size=7))
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    history = alacarte.fit(model, x, y, chunk_size=7, restarts=0, max_iter=6, progress=False)
    state = model.state_dict()

    for r in (0, 1):
        res = results[r]
        assert _close(res["loss"], loss)
        assert res["grads"].keys() == grads.keys()
        for name, g in grads.items():
            assert _close(res["grads"][name], g), name
        assert len(res["fit_loss"]) == len(history.loss)
        assert torch.allclose(torch.tensor(res["fit_loss"]), torch.tensor(history.loss), rtol=1e-10, atol=1e-10)
        for name, value in state.items():  # (six iterations amplify the sums' order: 2e-10 in a raw lengthscale)
            assert _close(res["state"][name], value, tol=1e-8), name
        assert _close(res["prediction"], model.predict(x[:5]).mean)
    for name, value in results[0]["restarted_state"].items():
        assert torch.equal(value, results[1]["restarted_state"][name]), name


def test_restarts_start_from_the_rows_one_process_would_take(tmp_path):
    """Restarts initialised from rank 0's rows alone: over 3 processes (restart_iter=3, max_iter=10) the first
    restart reached 1.872 per point, on one process 2.798, and the fitted parameters differed by up to 1.6."""
    results, _ = _launch("restarts", tmp_path, ranks=(0, 1, 2), world_size=3)
    x, y, model = make_case()
    first_rows = model.internal_inputs(x[:25]), (y[:25] - model.target_offset) / model.target_scale
    history = alacarte.fit(model, x, y, chunk_size=7, restarts=2, restart_iter=2, max_iter=3, progress=False)
    for r in (0, 1, 2):
        res = results[r]
        assert "error" not in res and "exit" not in res, res
        assert all(torch.equal(a, b) for a, b in zip(res["sample"], first_rows))  # rank 0's 21 and rank 1's first 4
        assert torch.allclose(torch.tensor(res["restart_losses"]), torch.tensor(history.restart_losses), rtol=1e-8)
        assert torch.allclose(torch.tensor(res["fit_loss"]), torch.tensor(history.loss), rtol=1e-8)
        for name, value in model.state_dict().items():
            assert _close(res["state"][name], value, 1e-8), name


def test_processes_that_round_differently_still_take_rank_zeros_steps(tmp_path):
    """Rank 1's loss is off by 1e-12 (another CPU's BLAS): rank 0's point, loss and gradient are everyone's."""
    results, _ = _launch("rounding", tmp_path)
    for r in (0, 1):
        assert "error" not in results[r] and "exit" not in results[r], results[r]
    assert results[0]["fit_loss"] == results[1]["fit_loss"]
    for name, value in results[0]["state"].items():
        assert torch.equal(value, results[1]["state"][name]), name
    for name, value in results[0]["grads"].items():
        assert torch.equal(value, results[1]["grads"][name]), name


def test_killed_distributed_fit_resumes_from_rank_zeros_checkpoint(tmp_path):
    results, _ = _launch("checkpoint", tmp_path)
    for r in (0, 1):
        assert "error" not in results[r] and "exit" not in results[r], results[r]
        assert results[r]["killed"]
        for name, value in results[r]["reference"].items():
            assert torch.equal(results[r]["resumed"][name], value), (r, name)
    assert results[0]["saved_stage"] == ["restart", 1]  # the resumed fits skipped restart 0
    written = [p.name for p in (tmp_path / "checkpoint").iterdir() if "ckpt" in p.name]
    assert written == ["fit.ckpt"]  # rank 0 alone writes


def test_mismatched_seed_is_reported(refused):
    results = refused["seed"]
    for r in (0, 1):
        message = results[r].get("error", "")
        assert "ValueError" in message and "rank 1 has kernel seed 18446744073709551615, rank 0 has 0" in message, results[r]
        assert "radius" in message  # FSARD's learned radii are drawn from the seed


def test_a_model_in_another_dtype_on_one_process_is_reported_as_such(refused):
    """A float32 model on rank 1 against float64 on rank 0 is named as such, not as differing in every
    one of its tensors with the advice to build the kernel with the same seed."""
    results = refused["dtype"]
    for r, dtype in ((0, "torch.float64"), (1, "torch.float32")):
        message = results[r].get("error", "")
        assert "ValueError" in message and "rank 1 holds its parameters and buffers in other dtypes than rank 0 " \
            f"(this process's model is {dtype};" in message, results[r]
        assert "differs from rank 0 in" not in message, message


def test_parameters_frozen_on_one_process_only_are_reported(refused):
    """Unchecked, each evaluation broadcast rank 0's mean constant into rank 1's noise: no error, and the
    processes ended with raw noises 2.94 and raw mean constants 0.24 apart."""
    results = refused["frozen"]
    for r in (0, 1):
        message = results[r].get("error", "")
        assert "ValueError" in message and "rank 1 trains other parameters than rank 0 (requires_grad" in message, \
            results[r]


def test_other_settings_on_one_process_are_reported(refused):
    """Unchecked, another Adam lr on rank 1 (0.2, rank 0's 0.05) ended with models 0.15 apart and no error;
    another statistics_dtype aborted rank 1 inside gloo."""
    results = refused["settings"]
    for r in (0, 1):
        message = results[r].get("error", "")
        assert "ValueError: every process must call fit with the same settings: rank 1 has lr=0.2 (rank 0: None); " \
               "rank 1 has statistics_dtype=torch.float32 (rank 0: torch.float64)" in message, results[r]
        assert "ValueError: PlainGP needs all rows in memory" in results[r].get("plain", ""), results[r]


def test_a_process_without_rows_makes_every_process_raise_a_value_error(refused):
    results = refused["empty"]
    assert "rank(s) 1 cannot train on their rows" in results[0].get("error", ""), results[0]
    assert "(rank 1) cannot train on its rows: x is empty" in results[1].get("error", ""), results[1]


def test_rows_that_fail_when_read_on_one_process_make_every_process_raise_a_value_error(refused):
    results = refused["bad rows"]
    for case, message in (("nan", "contains 1 non-finite value"), ("columns", "has 4 columns but the model expects 3"),
                          ("none", "the data yielded no rows")):
        assert "ValueError: rank(s) 1 cannot train on their rows" in results[0].get(case, ""), results[0]
        assert "(rank 1) cannot train on its rows: " in results[1].get(case, "") and message in results[1][case], \
            results[1]
    for r in (0, 1):
        message, reads = results[r]["path"]
        assert "does not exist" in message and reads == 0, results[r]


def test_a_checkpoint_path_refused_on_one_process_makes_every_process_raise_a_value_error(refused):
    """Checked outside the processes' agreement on errors, a checkpoint path refused on rank 1 alone (another
    machine's file system) left rank 0 to fail on a closed connection (RuntimeError)."""
    results = refused["checkpoint on one"]
    assert "ValueError: rank(s) 1 cannot train" in results[0].get("error", ""), results[0]
    assert "ValueError: " in results[1].get("error", "") and "does not exist" in results[1]["error"], results[1]


def test_rows_that_change_between_passes_on_one_process_make_every_process_raise(refused):
    results = refused["augmented"]
    for r in (0, 1):
        assert "ValueError: the chunks yielded other rows on a second pass than on the first on 1 process " in \
            results[r].get("error", ""), results[r]


@pytest.mark.slow
def test_dead_peer_errors_within_the_timeout(tmp_path):
    results, seconds = _launch("dead", tmp_path, timeout=10, wall=90)
    assert "error" in results[0], results[0]
    assert "streamed_negative_mll" in results[0]["error"]  # failed in training's all-reduce
    assert seconds < 60


@pytest.mark.slow
def test_missing_process_errors_within_the_timeout(tmp_path):
    # Rank 1 of a world of two never starts: rank 0's rendezvous must time out, not hang.
    results, seconds = _launch("fit", tmp_path, ranks=(0,), timeout=4, wall=90)
    assert "error" in results[0], results[0]
    assert seconds < 60

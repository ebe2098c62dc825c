"""Repeated inputs in the UCI datasets: how many test rows repeat a training row's inputs, and whether
their targets repeat too.

A GP with homoskedastic noise predicts a test row that repeats a training input from the rows at that
input; where the repeats carry the same target, the marginal likelihood can drive σ² to its floor and the
predictive density at the repeats is huge (exact ARD on wine, docs/calibration.md). A feature model with
D below the number of distinct inputs cannot follow it there. Per dataset, averaged over the splits:

- *train rows repeated*: the share of training rows whose inputs occur more than once in the training set;
- *test rows repeating*: the share of test rows whose inputs occur in the training set;
- *same target*: of those, the share whose target equals some training target at the same input;
- *within / total variance*: the pooled variance of the targets within repeated training inputs over the
  variance of all training targets — what the repeats say about the noise, on the targets' scale.

    python experiments/repeated_inputs.py --splits 0-9 --out experiments/results/repeated_inputs.md
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import alacarte as ac  # noqa: E402
from alacarte.bench import parse_splits  # noqa: E402
from alacarte.datasets.uci import list_uci  # noqa: E402


def input_groups(x: np.ndarray) -> dict[bytes, list[int]]:
    """The row indices of each distinct row of ``x`` (as float64), keyed by its bytes, in order of first appearance."""
    groups: dict[bytes, list[int]] = defaultdict(list)
    for i, row in enumerate(np.ascontiguousarray(x, dtype=np.float64)):
        groups[row.tobytes()].append(i)
    return groups


def within_group_variance(y: np.ndarray, groups: dict[bytes, list[int]]) -> float:
    """The pooled variance of ``y`` within the groups (NaN where no group has two rows)."""
    within = sum(((y[rows] - y[rows].mean()) ** 2).sum() for rows in groups.values())
    dof = sum(len(rows) - 1 for rows in groups.values())
    return within / dof if dof else np.nan


def repeats(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> dict:
    """One split's four shares (module docstring); ``same_target`` and ``within`` are NaN where there are
    no repeats to measure them on."""
    groups = input_groups(x_train)
    hits, same = 0, 0
    for j, row in enumerate(np.ascontiguousarray(x_test, dtype=np.float64)):
        rows = groups.get(row.tobytes())
        if rows is not None:
            hits += 1
            same += bool(np.any(y_train[rows] == y_test[j]))
    return {"train_repeated": sum(len(rows) for rows in groups.values() if len(rows) > 1) / len(x_train),
            "test_repeating": hits / len(x_test), "same_target": same / hits if hits else np.nan,
            "within": within_group_variance(y_train, groups) / y_train.var()}


def table(names: list[str], splits: list[int], data_dir: str | None) -> str:
    lines = ["| dataset | n train | train rows repeated | test rows repeating | same target | within / total variance |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in names:
        per_split, sizes = [], []
        for split in splits:
            data = ac.load_uci(name, split, data_dir)
            per_split.append(repeats(*(np.asarray(a) for a in (data.x_train, data.y_train, data.x_test, data.y_test))))
            sizes.append(len(data.x_train))
        mean = {k: np.nanmean([s[k] for s in per_split]) if any(np.isfinite(s[k]) for s in per_split) else np.nan
                for k in per_split[0]}
        cells = [f"{mean[k]:.2f}" if np.isfinite(mean[k]) else "–"
                 for k in ("train_repeated", "test_repeating", "same_target")]
        within = f"{mean['within']:.3f}" if np.isfinite(mean["within"]) else "–"
        lines.append(f"| {name} | {sizes[0]} | {' | '.join(cells)} | {within} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", default="0-9", type=parse_splits)
    parser.add_argument("--datasets", nargs="+", help="default: every UCI dataset")
    parser.add_argument("--data-dir", default=None, help="default: $ALACARTE_DATA")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    names = args.datasets or sorted(list_uci())
    command = "python experiments/repeated_inputs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"# Repeated inputs in the UCI datasets\n\nCommand: `{command}` (ALACARTE_DATA = the UCI folder).\n\n"
            f"Means over splits {args.splits[0]}–{args.splits[-1]}; the columns are defined in the script's "
            f"docstring (– : nothing repeats).\n\n{table(names, args.splits, args.data_dir)}\n")
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()

"""The same UCI cells fitted on the CPU and on a GPU: test RMSE side by side.

    python experiments/compare_devices.py --cpu experiments/results/uci_full.csv \
        --gpu experiments/results/uci_cuda.csv --out experiments/results/compare_devices.md
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from alacarte.benchmark import read_rows  # noqa: E402


def _ok(path) -> dict:
    return {(r["dataset"], int(r["split"]), r["method"]): r for r in read_rows(path) if r["status"] == "ok"}


def render(cpu_path, gpu_path, command: str) -> str:
    cpu, gpu = _ok(cpu_path), _ok(gpu_path)
    lines = [f"Command: `{command}`", "", "| dataset | split | method | RMSE CPU | RMSE GPU | relative difference "
             "| seconds CPU | seconds GPU |", "|---|---|---|---|---|---|---|---|"]
    for key in sorted(cpu.keys() & gpu.keys()):
        a, b = float(cpu[key]["rmse"]), float(gpu[key]["rmse"])
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {a:.6f} | {b:.6f} | {abs(a - b) / a:.1e} "
                     f"| {float(cpu[key]['train_seconds']):.0f} | {float(gpu[key]['train_seconds']):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    command = "python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:]))
    text = render(args.cpu, args.gpu, command)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

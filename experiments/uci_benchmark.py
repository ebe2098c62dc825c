"""The UCI benchmark (À la carte Table 1): the same runner as ``alacarte bench``.

    python experiments/uci_benchmark.py run --datasets yacht energy --methods gm pwl \
        --splits 0-9 --csv experiments/results/uci_small.csv
    python experiments/uci_benchmark.py report --csv experiments/results/uci_small.csv \
        --out experiments/results/uci_small.md
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from alacarte.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))

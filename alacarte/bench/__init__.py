"""The UCI benchmark: methods × datasets × splits, resumable, and a report beside the paper's Table 1.

Each cell (dataset, split, method) runs in its own process and appends one row
to a CSV under a file lock; re-running skips finished cells, so a killed run
resumes where it stopped, and a cell killed mid-fit resumes from its fit's
checkpoint.  A cell that outlives its time budget is stopped and recorded as
``timeout`` (not retried, unless a later run gives a longer ``--time-budget``);
a cell that raises is reported and retried on the next run.

Protocol as in the À la carte paper: inputs standardised on the training
split, RMSE in the target's original units, the same number of basis functions
for every method of a dataset, and exact RBF/ARD GPs only below 2000 training
points — above that the ``exact-*`` methods run as Fastfood expansions of the
same kernels (the row's ``model`` column says which). ::

    alacarte bench run --datasets yacht energy --methods gm pwl --splits 0-9 --csv uci.csv
    alacarte bench report --csv uci.csv --out uci.md

The modules, each importing only those before it: :mod:`~alacarte.bench.settings` (the methods,
defaults and checks), :mod:`~alacarte.bench.scores`, :mod:`~alacarte.bench.store` (the results
file), :mod:`~alacarte.bench.reporting` (the markdown report) and :mod:`~alacarte.bench.runner`
(the cell processes).  The command line (:mod:`alacarte.cli`) parses ``alacarte bench``'s options.
"""
from .reporting import PAPER_TABLE, load_paper, report
from .runner import run
from .scores import predictive_scores
from .settings import DEFAULT_NOISE_FLOOR, METHODS, package_version, parse_splits
from .store import FIELDS, append_row, read_rows, upgrade_csv

__all__ = ["METHODS", "DEFAULT_NOISE_FLOOR", "FIELDS", "PAPER_TABLE", "run", "report", "load_paper",
           "predictive_scores", "append_row", "read_rows", "upgrade_csv", "package_version", "parse_splits"]

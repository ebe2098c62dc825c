"""The reference of bench_features.py: scikit-learn-extra's Fastfood feature map, timed.

Runs in whichever interpreter has ``sklearn_extra`` (numpy only, no torch), either
imported by bench_features.py or as a script in a side environment::

    python _sklearn_extra_fastfood.py --n 36000 --d 1024 --m 4096 --repeats 3 --threads 2

prints one JSON line: ``seconds`` (median ``transform`` time), ``width`` (its output
columns) and the versions.
"""
from __future__ import annotations

import argparse
import json


def transform_seconds(n: int, d: int, m: int, repeats: int, threads: int, seed: int = 0) -> dict:
    """Median time of ``Fastfood(n_components=m).transform`` on n×d float64 normal data.

    ``fit`` (drawing the random diagonals) runs once, untimed: only the map
    x -> [cos, sin](V x) is timed, as bench_features.py times ff[auto].
    ``n_components`` is the number of frequencies M (its default
    ``tradeoff_mem_accuracy="accuracy"`` returns cos and sin: 2M columns, like ours).
    """
    import numpy as np
    import sklearn_extra
    from sklearn_extra.kernel_approximation import Fastfood
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency

    from _timing import median_time

    x = np.random.default_rng(seed).standard_normal((n, d))
    with threadpool_limits(threads):
        fastfood = Fastfood(n_components=m, random_state=seed).fit(x)
        width = fastfood.transform(x[:1]).shape[1]
        seconds = median_time(lambda: fastfood.transform(x), repeats)
    return {"seconds": seconds, "width": width, "sklearn_extra": sklearn_extra.__version__,
            "numpy": np.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("n", "d", "m", "repeats", "threads"):
        parser.add_argument(f"--{name}", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(transform_seconds(args.n, args.d, args.m, args.repeats, args.threads)), flush=True)


if __name__ == "__main__":
    main()

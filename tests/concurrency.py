"""Running a check from two threads at once, for the tests of shared scratch buffers."""
from __future__ import annotations

import threading
from collections.abc import Callable


def failures_in_two_threads(check: Callable[[int], bool], repeats: int) -> list[int]:
    """Run ``check(i)`` ``repeats`` times in each of two threads (i = 0, 1) at once; how many
    calls of each thread returned False."""
    failures = [0, 0]

    def work(i: int) -> None:
        for _ in range(repeats):
            failures[i] += not check(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures

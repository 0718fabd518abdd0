"""Python's cyclic garbage collector in the serving process: set once, at the start
of serving (the ASGI lifespan's startup), before any request runs.

An answer of allocation candidates is tens of thousands of small containers
(dicts, lists, tuples), all alive until it is sent and none in a reference cycle:
reference counting frees them.  With the collector's default threshold (a young
collection every 700 new containers still alive), building one walked them again
and again and every few requests walked the whole heap (the kept provider rows
included) to free nothing: on the nested benchmark (1,000 trees, 2,000 candidates)
55 young and 0.3 full collections per answer, tens of milliseconds at the tail.

At start the objects loaded so far (modules, tables, compiled statements) are
frozen (``gc.freeze``: never walked again), and a young collection waits for
``YOUNG_THRESHOLD`` new containers still alive: more than any answer holds, so
answers are built without a collection; cyclic garbage, which the service does not
make, is still collected.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 100_000


def tune() -> None:
    """Freeze what is loaded and raise the young generation's threshold (the older
    generations' stay as they are)."""
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)

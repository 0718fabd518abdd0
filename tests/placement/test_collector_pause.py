"""The allocation-candidate search keeps Python's cyclic collector off while it
builds an answer: overlapping requests in several threads must leave it as they
found it."""

from __future__ import annotations

import gc
import threading

from devtag_host.placement.objects.allocation_candidate import _CollectorPause


def test_overlapping_pauses_turn_the_collector_back_on_after_the_last_one():
    pause = _CollectorPause()
    assert gc.isenabled()
    first, second = pause(), pause()
    first.__enter__()
    assert not gc.isenabled()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second request is still building
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    pause = _CollectorPause()
    gc.disable()
    try:
        with pause():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_error_while_building_still_turns_it_back_on():
    pause = _CollectorPause()
    try:
        with pause():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()


def test_many_threads():
    pause = _CollectorPause()
    start = threading.Barrier(8)
    collector_on_inside = []

    def request() -> None:
        start.wait()
        for _ in range(200):
            with pause():
                if gc.isenabled():
                    collector_on_inside.append(threading.get_ident())

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not collector_on_inside
    assert gc.isenabled()

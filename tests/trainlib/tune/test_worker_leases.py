from __future__ import annotations

from trainlib.tune.worker_leases import WorkerBook

LIVE = ["tcp://a", "tcp://b", "tcp://c"]


def test_leases_released_workers_are_free_again_longest_free_first() -> None:
    book = WorkerBook()
    assert book.reserve("trial-0", 2, LIVE)
    assert book.free(LIVE) == ["tcp://c"]
    book.release("trial-0")
    assert book.free(LIVE) == ["tcp://c", "tcp://a", "tcp://b"]


def test_leases_withheld_worker_is_never_lent_again() -> None:
    book = WorkerBook()
    lease = book.lease("trial-0", 2)
    assert lease.allowed(LIVE) == {"tcp://a", "tcp://b"}
    lease.withhold({"tcp://b"})  # its rank did not stop when the trial was pruned
    book.release("trial-0")
    assert book.free(LIVE) == ["tcp://c", "tcp://a"]
    assert not book.reserve("trial-1", 3, LIVE)
    assert book.lease("trial-1", 2).allowed(LIVE) == {"tcp://a", "tcp://c"}

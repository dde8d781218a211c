from __future__ import annotations

from trainlib._internal.driver.ranks import assign_ranks


def test_ranks_assigned_by_host_then_address() -> None:
    workers = [
        ("10.0.0.2", "tcp://10.0.0.2:2"),
        ("10.0.0.1", "tcp://10.0.0.1:9"),
        ("10.0.0.2", "tcp://10.0.0.2:1"),
        ("10.0.0.1", "tcp://10.0.0.1:3"),
    ]
    slots = assign_ranks(workers)
    assert [(s.address, s.world_rank, s.local_rank, s.node_rank) for s in slots] == [
        ("tcp://10.0.0.1:3", 0, 0, 0),
        ("tcp://10.0.0.1:9", 1, 1, 0),
        ("tcp://10.0.0.2:1", 2, 0, 1),
        ("tcp://10.0.0.2:2", 3, 1, 1),
    ]
    assert {s.local_world_size for s in slots} == {2}
    assert assign_ranks(list(reversed(workers))) == slots

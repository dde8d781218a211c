from __future__ import annotations

import pickle

from trainlib import NotEnoughWorkersError, RankFailure, WorkerGroupError


def _failures() -> dict[int, RankFailure]:
    return {
        0: RankFailure(
            0,
            "hostA",
            "exception",
            "RuntimeError: gloo connection reset",
            "Traceback...\nRuntimeError",
            time=2.0,
            is_collective_error=True,
        ),
        1: RankFailure(
            1,
            "hostB",
            "exception",
            "ValueError: boom",
            "Traceback (most recent call last):\nValueError: boom",
            time=3.0,
        ),
        2: RankFailure(2, "hostB", "stopped", "stopped after another rank failed", time=1.0),
    }


def test_worker_group_error_root_cause_skips_collective_and_stopped_ranks() -> None:
    assert WorkerGroupError(_failures()).root_cause.world_rank == 1


def test_worker_group_error_shows_one_traceback_and_one_line_per_other_rank() -> None:
    text = str(WorkerGroupError(_failures(), num_restarts=2))
    assert text.startswith("Training failed after 2 restart(s): rank 1 on host hostB: ValueError")
    assert text.count("Traceback") == 1
    assert "  rank 0 (hostA): RuntimeError: gloo connection reset" in text
    assert "  rank 2 (hostB): stopped after another rank failed" in text


def test_worker_group_error_survives_pickling() -> None:
    error = WorkerGroupError(_failures(), num_restarts=1)
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)
    assert copy.failures == error.failures
    # Ray's name for them: each rank's failure as an exception, which survives pickling too
    assert {r: e.failure for r, e in copy.worker_failures.items()} == error.failures
    again = pickle.loads(pickle.dumps(copy.worker_failures[0]))
    assert again.failure == error.failures[0] and str(again) == error.failures[0].one_line()


def test_not_enough_workers_error_names_counts_address_and_fix() -> None:
    error = NotEnoughWorkersError(
        requested=4, available=2, address="tcp://10.0.0.5:8786", timeout_s=60
    )
    expected = (
        "ScalingConfig(num_workers=4) needs 4 Dask workers but tcp://10.0.0.5:8786 has 2 "
        "after 60 s; lower num_workers or add workers to the cluster."
    )
    assert str(error) == expected
    assert str(pickle.loads(pickle.dumps(error))) == expected


def test_not_enough_workers_error_names_what_it_still_waits_for() -> None:
    error = NotEnoughWorkersError(
        requested=2,
        available=1,
        address="tcp://10.0.0.5:8786",
        timeout_s=60,
        waiting_for="SLURM job 12 PENDING (Resources)",
    )
    expected = (
        "ScalingConfig(num_workers=2) needs 2 Dask workers but tcp://10.0.0.5:8786 has 1 "
        "after 60 s; still waiting for SLURM job 12 PENDING (Resources); lower num_workers "
        "or add workers to the cluster."
    )
    assert str(error) == expected
    assert str(pickle.loads(pickle.dumps(error))) == expected

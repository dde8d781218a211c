"""A rank's threads come from the cores its Dask worker may use, not from the host's count."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.helpers import run_script_for_result

_SCRIPT = textwrap.dedent(
    """
    import json, os

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # a one-core cpuset, as SLURM gives

    import trainlib
    from trainlib import DaskConfig, RunConfig, ScalingConfig
    from trainlib.torch import TorchTrainer


    def train_func():
        import torch
        import torch._inductor.config

        trainlib.report(
            {
                "cores": len(os.sched_getaffinity(0)),
                "threads": torch.get_num_threads(),
                "compile_threads": torch._inductor.config.compile_threads,
            }
        )


    if __name__ == "__main__":
        result = TorchTrainer(
            train_func,
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(storage_path=os.path.abspath("runs")),
            dask_config=DaskConfig(cluster_kwargs={"processes": True}),
        ).fit()
        print("RESULT " + json.dumps({**result.metrics, "host_cores": os.cpu_count()}))
    """
)


def test_a_rank_in_a_one_core_cpuset_runs_one_thread_and_one_compile_worker(
    tmp_path: Path,
) -> None:
    script = tmp_path / "affinity.py"
    script.write_text(_SCRIPT)
    metrics = run_script_for_result(script, cwd=tmp_path)
    assert metrics["cores"] == 1
    assert (metrics["threads"], metrics["compile_threads"]) == (1, 1)
    assert metrics["host_cores"] >= metrics["cores"]

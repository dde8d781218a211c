"""Ranks on several hosts (network namespaces): a host cut off the network is detected and the
group re-forms on the hosts still reachable, from the latest checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import skip_or_fail, wait_for_path
from tests.netns import Hosts, simulated_hosts, unavailable_reason

SCHEDULER = 1  # host numbers; workers run on 2, 3 and 4, the driver on 1
WORKERS = (2, 3, 4)
CUT = 3  # rank 1's host (ranks are ordered by host)

DRIVER = """
import json, os, sys, tempfile, time
import torch
import trainlib
from distributed import Client
from trainlib import Checkpoint, DaskConfig, FailureConfig, RunConfig, ScalingConfig
from trainlib.torch import TorchTrainer, prepare_model

def train_func(config):
    context = trainlib.get_context()
    model = prepare_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start, checkpoint = 0, trainlib.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = torch.load(os.path.join(directory, "s.pt"), weights_only=True)["step"] + 1
    for step in range(start, config["steps"]):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduce across hosts
        optimizer.step()
        time.sleep(0.2)
        with tempfile.TemporaryDirectory() as directory:
            if context.get_world_rank() == 0:
                torch.save({"step": step}, os.path.join(directory, "s.pt"))
            trainlib.report({"step": step, "world_size": context.get_world_size()},
                            checkpoint=Checkpoint.from_directory(directory))
        if checkpoint is None and step == 3 and context.get_world_rank() == 0:
            open(config["marker"], "w").close()

address, storage, marker = sys.argv[1:4]
Client(address).wait_for_workers(3, timeout=120)
result = TorchTrainer(
    train_func,
    train_loop_config={"steps": 15, "marker": marker},
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(name="multihost", storage_path=storage,
                         failure_config=FailureConfig(max_failures=1, hang_timeout_s=10)),
    dask_config=DaskConfig(address=address),
).fit()
print("RESULT " + json.dumps({"metrics": result.metrics, "restarts": result.num_restarts,
                              "failures": [f.one_line() for f in result.failures]}))
"""


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    if (reason := unavailable_reason()) is not None:
        skip_or_fail(reason)
    net = f"10.78.{os.getpid() % 250}"
    with simulated_hosts(f"tl{os.getpid() % 100000}", net, 4) as made:
        yield made


def _start(hosts: Hosts, host: int, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            hosts.command(host, argv), env=env, stdout=out, stderr=subprocess.STDOUT
        )


def test_multihost_cut_host_is_detected_and_group_reforms(hosts: Hosts, tmp_path: Path) -> None:
    python = sys.executable
    scheduler = f"tcp://{hosts.address(SCHEDULER)}:8786"
    processes = [
        _start(
            hosts,
            SCHEDULER,
            [
                python,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                hosts.address(SCHEDULER),
                "--port",
                "8786",
                "--no-dashboard",
            ],
            tmp_path / "scheduler.log",
        )
    ]
    processes += [
        _start(
            hosts,
            h,
            [
                python,
                "-m",
                "distributed.cli.dask_worker",
                scheduler,
                "--host",
                hosts.address(h),
                "--nthreads",
                "1",
                "--nworkers",
                "1",
                "--no-dashboard",
                "--name",
                f"h{h}",
            ],
            tmp_path / f"worker{h}.log",
        )
        for h in WORKERS
    ]
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    marker = tmp_path / "trained-4-steps"
    driver = subprocess.Popen(
        hosts.command(
            SCHEDULER, [python, str(script), scheduler, str(tmp_path / "runs"), str(marker)]
        ),
        env={**os.environ, "GLOO_SOCKET_IFNAME": "eth0"},
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_path(marker, timeout_s=180)
        hosts.cut(CUT)
        stdout, stderr = driver.communicate(timeout=240)
    finally:
        for process in [driver, *processes]:
            process.kill()
            process.wait()
    assert driver.returncode == 0, stderr.decode()[-4000:]
    line = next(x for x in stdout.decode().splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["metrics"] == {"step": 14, "world_size": 2}
    assert result["restarts"] == 1
    assert "made no progress" in result["failures"][0]

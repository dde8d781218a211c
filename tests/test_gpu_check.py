"""benchmarks/gpu_check.py where there is no GPU (every machine here): the facts, then a clear
exit; its wheel list pinned as the project pins each package."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_gpu_check_without_a_device_says_so_after_the_facts(tmp_path: Path) -> None:
    report = tmp_path / "gpu-check.md"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--out", str(report)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "No CUDA device here: nothing more to check."
    written = report.read_text()
    assert written.startswith("# GPU check\n\n- torch ")
    assert "- CUDA devices: none (torch.cuda.is_available() is False)" in written


def test_gpu_check_wheels_are_pinned_as_the_project_pins_them() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = {*project["dependencies"], *project["optional-dependencies"]["dev"]}
    lines = (REPO / "benchmarks" / "gpu_check.txt").read_text().splitlines()
    wanted = [line for line in lines if line and not line.startswith("#")]
    assert [w for w in wanted if w not in pinned] == []


# What a bare GPU host lacks: the project's packages beyond benchmarks/gpu_check.txt.
ABSENT_ON_A_GPU_HOST = (
    "prefect", "mlflow", "s3fs", "boto3", "botocore", "aiobotocore", "optuna", "moto",
    "psycopg2", "hypothesis", "sqlalchemy", "fastapi", "dask_jobqueue",
)  # fmt: skip
# pytest plugins of those packages (installed here, absent there)
NO_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider")
_AS_ON_A_BARE_HOST = """
import importlib.abc, sys
ABSENT = set(sys.argv[1].split(","))

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Absent())
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""


@pytest.mark.integration  # starts a process (tests/process_guard.py)
def test_gpu_check_tests_import_nothing_a_bare_gpu_host_lacks() -> None:
    """The GPU tests collected, and their files' CPU tests run (the conftest's session fixtures
    set up), with Prefect, MLflow, S3 and the rest made unimportable."""
    absent = ",".join(ABSENT_ON_A_GPU_HOST)
    gpu_tests = re.findall(r'"(tests/[\w/]+\.py)"', (REPO / "benchmarks/gpu_check.py").read_text())
    assert gpu_tests
    cpu_tests = "tests/trainlib/_internal/rank/test_transfer.py"
    for args in (["--collect-only", *gpu_tests], [cpu_tests]):
        done = subprocess.run(
            [sys.executable, "-c", _AS_ON_A_BARE_HOST, absent, "-q", *NO_PLUGINS, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "No module named" not in done.stdout + done.stderr

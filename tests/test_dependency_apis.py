"""The product uses the public APIs of the services it integrates: outside the one adapter per
dependency that says why, no module imports a ``_``-prefixed module of Prefect, Dask,
distributed, MLflow or fsspec, reads a ``_``-prefixed attribute the product does not define
itself (so one of a dependency's objects), or touches distributed's scheduler RPC handle
(import-linter sees external packages only as a whole, so this reads the code). (The ranks
preload ``torch._dynamo`` only to spare DDP its import time; ``os._exit`` is the standard
library's documented exit of a forked child.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("cli", "flows", "tasks", "mlops", "cifar", "trainlib", "deployments")
DEPENDENCIES = {"prefect", "dask", "distributed", "mlflow", "fsspec"}
ADAPTERS = {  # each says why, and is tested
    "trainlib/_internal/common/dask_internals.py",
    "trainlib/_internal/common/scheduler_rpc.py",
    "trainlib/_locations.py",
}
PUBLIC_PRIVATE = {"_exit", "_dynamo", "_inductor"}  # os._exit; torch's, see the docstring
# distributed's scheduler RPC handle and what only it reaches (Client.scheduler, a lease's
# scheduler_rpc= and refresh callback, the scheduler's semaphore_register)
RPC_ATTRIBUTES = {"scheduler", "refresh_callback", "semaphore_register"}
RPC_KEYWORDS = {"scheduler_rpc"}


def _files() -> list[Path]:
    return [path for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))]


def defined_names(paths: list[Path]) -> set[str]:
    """Every name the product defines: functions, classes, attributes, variables, parameters."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[-1])
    return names


def private_uses(path: Path, own: set[str]) -> list[str]:
    """``what (line N)`` for each use in ``path`` of a dependency's private module, of a
    private attribute not in ``own`` (the product's names), or of the scheduler RPC handle."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Attribute):
            attr, base = node.attr, node.value
            private = attr.startswith("_") and not attr.startswith("__")
            theirs = private and attr not in own and attr not in PUBLIC_PRIVATE
            own_object = isinstance(base, ast.Name) and base.id in {"self", "cls"}
            rpc = attr in RPC_ATTRIBUTES and not own_object and _reaches_distributed(base)
            if theirs or rpc:
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
            continue
        elif isinstance(node, ast.keyword) and node.arg in RPC_KEYWORDS:
            found.append(f"{node.arg}= (line {getattr(node, 'lineno', '?')})")
            continue
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in DEPENDENCIES and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{name} (line {node.lineno})")
    return found


def _reaches_distributed(base: ast.expr) -> bool:
    """Whether ``base`` reads as one of distributed's objects: a client, a worker, a nanny or
    a lease (by the name the product gives it)."""
    text = ast.unparse(base).lower()
    return any(word in text for word in ("client", "worker", "nanny", "lock", "semaphore"))


def test_no_module_uses_a_private_api_of_a_dependency() -> None:
    files = _files()
    own = defined_names(files)
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in files
        if str(path.relative_to(ROOT)) not in ADAPTERS and (found := private_uses(path, own))
    }
    assert offenders == {}


def test_the_check_sees_each_kind_of_private_use(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f(client, fs, lock):\n"
        "    from dask._task_spec import Task\n"
        "    import prefect\n"
        "    fs._strip_protocol('s3://b')\n"
        "    client.scheduler.identity()\n"
        "    Lock('x', scheduler_rpc=client.scheduler)\n"
        "    lock.refresh_callback.stop()\n"
        "    self._mine = fs._mine\n"
    )
    assert sorted(private_uses(module, own={"_mine"})) == [
        "client.scheduler (line 5)",
        "client.scheduler (line 6)",
        "dask._task_spec (line 2)",
        "fs._strip_protocol (line 4)",
        "lock.refresh_callback (line 7)",
        "scheduler_rpc= (line 6)",
    ]


def test_each_adapter_is_the_only_one_and_still_needed() -> None:
    for adapter in ADAPTERS:
        assert private_uses(ROOT / adapter, defined_names(_files()) - {"_strip_protocol"}), (
            f"{adapter} uses nothing private: drop it"
        )

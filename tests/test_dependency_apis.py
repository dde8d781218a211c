"""The product uses the public APIs of the services it integrates: no module imports a
``_``-prefixed module of Prefect, Dask, distributed, MLflow or fsspec, except the one adapter per
dependency that says why (import-linter sees external packages only as a whole, so this reads
the imports). (The ranks preload ``torch._dynamo`` only to spare DDP its import time.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("cli", "flows", "tasks", "mlops", "cifar", "trainlib", "deployments")
DEPENDENCIES = {"prefect", "dask", "distributed", "mlflow", "fsspec"}
ADAPTERS = {"trainlib/_internal/common/dask_internals.py"}  # each says why, and is tested


def private_imports(path: Path) -> list[str]:
    """``module (line N)`` for each import of a dependency's private module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in DEPENDENCIES and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{name} (line {node.lineno})")
    return found


def test_no_module_imports_a_private_module_of_a_dependency() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in ADAPTERS and (found := private_imports(path))
    }
    assert offenders == {}


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from dask._task_spec import Task\n    import prefect\n")
    assert private_imports(module) == ["dask._task_spec (line 2)"]


def test_each_adapter_is_the_only_one_and_still_needed() -> None:
    for adapter in ADAPTERS:
        assert private_imports(ROOT / adapter), f"{adapter} imports nothing private: drop it"

"""The stack's inside certificates, made by its setup (``docker/write_secrets.py``) with openssl.

Two systems authenticate their members by certificate, each with its own authority, so that a
member of one is no member of the other:
  dask     the scheduler, the Dask workers and the Prefect worker (its client): TLS both ways,
           a client without a certificate of this authority is refused
  s3_grpc  SeaweedFS's own gRPC ports (its S3 gateway's reconfiguration among them)
Each is made once and kept; an authority's key stays in the secrets folder, mounted nowhere.
Rotate by deleting a system's files there and running the setup again (docs/containers.md).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

SYSTEMS = {  # system -> the names its certificate answers to
    "dask": ["dask-scheduler", "dask-worker-1", "dask-worker-2", "prefect-worker", "localhost"],
    "s3_grpc": ["s3", "localhost"],
}
DAYS = 825  # a leaf's life, as browsers cap it; the authority's: ten years
_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def files(system: str) -> dict[str, str]:
    """A system's files in the secrets folder: the authority's certificate and key, its own."""
    return {part: f"{system}_{part}" for part in ("ca", "ca_key", "cert", "key")}


def ensure(secrets: Path) -> list[str]:
    """Make every system's certificates that are missing from ``secrets``; the names made."""
    made = []
    for system, names in SYSTEMS.items():
        paths = {part: secrets / name for part, name in files(system).items()}
        if all(p.exists() for p in paths.values()):
            continue
        if shutil.which("openssl") is None:
            raise SystemExit("openssl is needed to make the stack's certificates: install it")
        _make(system, names, paths)
        made += [p.name for p in paths.values()]
    return made


def _make(system: str, names: list[str], paths: dict[str, Path]) -> None:
    ca, ca_key, cert, key = (paths[p] for p in ("ca", "ca_key", "cert", "key"))
    with tempfile.TemporaryDirectory() as scratch:
        request, extensions = Path(scratch, "leaf.csr"), Path(scratch, "leaf.ext")
        authority = f"/CN=dask-train-cifar {system} authority"
        _openssl("req", "-x509", *_CURVE, "-keyout", ca_key, "-out", ca, "-days", "3650",
                 "-subj", authority)  # fmt: skip
        _openssl("req", *_CURVE, "-keyout", key, "-out", request, "-subj", f"/CN={system}")
        alt = ",".join([*(f"DNS:{n}" for n in names), "IP:127.0.0.1"])
        extensions.write_text(f"subjectAltName={alt}\nextendedKeyUsage=serverAuth,clientAuth\n")
        _openssl("x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                 "-CAserial", Path(scratch, "serial"), "-out", cert, "-days", str(DAYS),
                 "-extfile", extensions)  # fmt: skip
    ca_key.chmod(0o600)  # only the setup signs
    key.chmod(0o644)  # read by the container's user; the folder is the owner's only


def _openssl(*args: str | Path) -> None:
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"openssl {args[0]} failed: {done.stderr.strip()}")

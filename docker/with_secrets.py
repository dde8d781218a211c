#!/usr/bin/env python3
"""Give a command its secrets from files, then run it (``exec``): the image's entrypoint.

    with-secrets prefect worker start ...

For every variable ``NAME_FILE`` in the environment that names a file in /run/secrets (where
compose mounts its secrets), ``NAME`` is set to that file's contents (a trailing newline
dropped) and ``NAME_FILE`` removed; other ``*_FILE`` variables (a log file) stay as they are,
and so do those whose program reads the secret file itself (``AWS_SHARED_CREDENTIALS_FILE``,
Dask's ``..._TLS__CA_FILE``: the credentials never enter the environment).
The secrets so never appear in the compose file, in ``docker inspect`` or in a Prefect job
variable, only in the environment of the process that uses them. A file that cannot be read
stops the container with one line naming it, and so does a variable whose value is still a
compose expression (``${NAME:-}``: podman-compose 1.0 leaves some forms unexpanded, and the
program would take the expression for the value).
"""

from __future__ import annotations

import os
import re
import sys

UNEXPANDED = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*[^}]*\}")
SUFFIX = "_FILE"
SECRETS = "/run/secrets/"
READ_BY_THE_PROGRAM = frozenset(
    {"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "DASK_DISTRIBUTED__COMM__TLS__CA_FILE"}
)


def load(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with each ``NAME_FILE`` replaced by ``NAME`` and the file's contents."""
    for key, value in environ.items():
        if UNEXPANDED.search(value):
            sys.exit(
                f"with-secrets: {key} is {value!r}, a compose expression the compose engine did "
                "not expand; set the variable (docker/.env) or write its value into the compose "
                "file."
            )
    loaded = dict(environ)
    for key, path in environ.items():
        if not key.endswith(SUFFIX) or key == SUFFIX or not path.startswith(SECRETS):
            continue
        if key in READ_BY_THE_PROGRAM:
            continue
        try:
            with open(path, encoding="utf-8") as secret:
                value = secret.read().removesuffix("\n")
        except OSError as error:
            sys.exit(f"with-secrets: cannot read {key}={path} ({error.strerror}); is it set?")
        loaded[key.removesuffix(SUFFIX)] = value
        del loaded[key]
    return loaded


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: with-secrets COMMAND [ARG...]")
    os.execvpe(argv[0], argv, load(dict(os.environ)))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Where predict-cifar may write on a worker with a run policy: a new file, outside the folders
the pipeline keeps.

Whoever starts predict-cifar names ``output``, and the worker's storage key may write all of
what the policy's ``write`` lists, the pipeline's own data included. Unchecked, an output could
replace another run's checkpoint, a dataset's manifest or a run name's owner record
(``tasks.layout``), or plant one before its run writes it. So there ``output``, and the list of
unreadable images beside it, must not exist yet, and no folder on its path may be one the
pipeline keeps under a storage path (``KEPT_FOLDERS``). On a user's own command line (no policy)
an output is the user's to overwrite.
"""

from __future__ import annotations

import fsspec

from flows.places import PolicyError, place, shown
from flows.run_policy import RunPolicy
from tasks.layout import KEPT_FOLDERS
from tasks.predict import errors_beside


def check_output(output: str, policy: RunPolicy) -> None:
    """Refuse an ``output`` that would overwrite or write into what the pipeline keeps.

    Raises:
        PolicyError: ``output`` lies in a kept folder, or it or its errors file exists.
    """
    if policy.source is None:
        return
    folders = place("output", output).split("://", 1)[1].split("/")[1:-1]
    if kept := sorted(KEPT_FOLDERS.intersection(folders)):
        raise PolicyError(
            f"output {shown(output)!r} lies in a folder named {kept[0]!r}, where the pipeline "
            f"keeps its own data ({', '.join(sorted(KEPT_FOLDERS))}); predictions never go "
            "there on this worker. Name a file elsewhere, e.g. under predictions/."
        )
    for uri in (output, errors_beside(output)):
        fs, path = fsspec.core.url_to_fs(uri)
        if fs.exists(path):
            raise PolicyError(
                f"{shown(uri)!r} exists already, and predict-cifar never overwrites on this "
                "worker (it could be another run's data). Name a new file, e.g. with the date "
                "in it, or remove the old one first."
            )

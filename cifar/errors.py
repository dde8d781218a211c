"""The errors the train-cifar pipeline explains to its users.

::

    PipelineError                 str(error) is the whole message: what failed, why, what to do
    ├── InvalidParameterError     a flow parameter cannot work (an unknown model)  (ValueError)
    ├── DownloadError             the archive could not be fetched (network, HTTP status, access)
    ├── ChecksumError             the archive's md5 is not the expected one  (also a ValueError)
    ├── NotCifarArchiveError      not a CIFAR-10 python archive, or truncated  (also a ValueError)
    ├── UnsafeArchiveError        a member could escape the target or fill the disk (ValueError)
    ├── DatasetTooSmallError      too few images for the ranks and batch size  (also a ValueError)
    ├── CorruptDataError          a dataset file does not match its sha256  (also a ValueError)
    ├── TrainingDivergedError     the loss became NaN or infinite
    ├── ModelNotFoundError        no such registered model, version or alias  (also a LookupError)
    └── PublishError              register → evaluate → promote failed and was rolled back

``cli.local_server.PrefectServerError`` (a PipelineError too): Prefect's temporary server for a
local run did not start.
"""

from __future__ import annotations


class PipelineError(Exception):
    """An error whose message tells the user what failed, the cause and what to do."""


class InvalidParameterError(PipelineError, ValueError):
    """A parameter of the pipeline has a value it cannot work with."""


class DownloadError(PipelineError):
    """The archive could not be downloaded.

    Attributes:
        url: What was downloaded.
        cause: The cause in plain words ("name resolution failed", "HTTP 404 Not Found").
        transient: The network may recover (it was retried); otherwise retrying cannot help.
        tries: How often the download was tried.
    """

    def __init__(self, url: str, cause: str, transient: bool, tries: int, advice: str) -> None:
        super().__init__(url, cause, transient, tries, advice)  # all of them: it pickles
        self.url, self.cause, self.transient, self.tries = url, cause, transient, tries
        self.advice = advice

    def __str__(self) -> str:
        from urllib.parse import urlparse

        host = urlparse(self.url).hostname or self.url
        if self.transient:
            what = f"Cannot reach {host} ({self.cause}) after {self.tries} tries."
        else:
            what = f"Cannot download {self.url}: {self.cause}."
        return f"{what} {self.advice}".strip()


class ChecksumError(PipelineError, ValueError):
    """The downloaded archive does not have the expected md5."""


class NotCifarArchiveError(PipelineError, ValueError):
    """A file is not a CIFAR-10 python archive (or is truncated)."""


class UnsafeArchiveError(PipelineError, ValueError):
    """The archive has a member that could escape the target directory or exhaust the disk."""


class DatasetTooSmallError(PipelineError, ValueError):
    """The dataset cannot give every rank a batch."""


class CorruptDataError(PipelineError, ValueError):
    """A dataset file does not match its sha256 in the manifest."""


class TrainingDivergedError(PipelineError):
    """The training loss became NaN or infinite."""


class ModelNotFoundError(PipelineError, LookupError):
    """The registry has no such model, version or alias."""


class PublishError(PipelineError):
    """Registering, evaluating or promoting a new model version failed; what was done is undone
    (the version removed from the registry, the aliases where they were).

    Attributes:
        model_name: The registered model.
        version: The version that was registered and removed again (None: none was).
        cause: The failure, in one line.
    """

    def __init__(self, model_name: str, version: str | None, cause: str) -> None:
        super().__init__(model_name, version, cause)  # all of them: it pickles
        self.model_name, self.version, self.cause = model_name, version, cause

    def __str__(self) -> str:
        undone = (
            f"version {self.version} was removed from the registry again"
            if self.version is not None
            else "no version was registered"
        )
        return (
            f"Publishing the trained model as {self.model_name!r} failed: "
            f"{self.cause.rstrip('.')}. "
            f"Nothing was published: {undone} and no alias moved (@champion is unchanged). "
            "The MLflow run and its checkpoints are kept; fix the cause and run the flow again "
            "with the same run_name to publish it without training again."
        )

"""The pipeline's Prefect tasks and the request and result types they pass between them.

Beside the tasks: the options they share (``caching.py``, the cache policy of the data steps;
``retrying.py``, which failures a task retries) and the plain inputs they take
(``layout.py``, where each thing goes under the storage path; ``search_space.py``, a search
space as JSON). The rules the tasks apply live in ``mlops/``, the CIFAR domain in ``cifar/``.

Errors (each a ``cifar.errors.PipelineError``)::

    download_failures.DownloadError  the archive could not be fetched (network, HTTP, access)
    download.ChecksumError           the archive's md5 is not the expected one (ValueError)
"""

"""What every Dask worker of a run needs before a rank is placed: its pool of rank processes
(``rank_pool``) and the plugins that retire a preempted SLURM job's worker gracefully
(``preemption_retirement``). Registering them again is a no-op."""

from __future__ import annotations

from distributed import Client

from trainlib._internal.worker import preemption_retirement
from trainlib._internal.worker.rank_pool import RankPoolPlugin


def install(client: Client) -> None:
    """Register the run's worker plugins on every worker of ``client``'s cluster, present and
    to come (a rank pool's fork server starts now)."""
    client.register_plugin(RankPoolPlugin())
    preemption_retirement.register(client)

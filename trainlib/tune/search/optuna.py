"""``from ray.tune.search.optuna import OptunaSearch`` ports as
``from trainlib.tune.search.optuna import OptunaSearch``."""

from trainlib.tune.search import OptunaSearch

__all__ = ["OptunaSearch"]

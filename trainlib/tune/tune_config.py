"""``from ray.tune.tune_config import TuneConfig`` ports as
``from trainlib.tune.tune_config import TuneConfig``."""

from trainlib.tune.config import TuneConfig

__all__ = ["TuneConfig"]

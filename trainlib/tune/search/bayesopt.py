"""``from ray.tune.search.bayesopt import BayesOptSearch`` ports as
``from trainlib.tune.search.bayesopt import BayesOptSearch``."""

from trainlib.tune.search import BayesOptSearch

__all__ = ["BayesOptSearch"]

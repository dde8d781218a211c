"""``from ray.tune.search.basic_variant import BasicVariantGenerator`` ports as
``from trainlib.tune.search.basic_variant import BasicVariantGenerator``."""

from trainlib.tune.search import BasicVariantGenerator

__all__ = ["BasicVariantGenerator"]

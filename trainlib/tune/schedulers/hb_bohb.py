"""``from ray.tune.schedulers.hb_bohb import HyperBandForBOHB`` ports as
``from trainlib.tune.schedulers.hb_bohb import HyperBandForBOHB``."""

from trainlib.tune.schedulers import HyperBandForBOHB

__all__ = ["HyperBandForBOHB"]

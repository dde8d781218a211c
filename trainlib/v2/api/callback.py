"""``ray.train.v2.api.callback``."""

from trainlib.user_callback import UserCallback

__all__ = ["UserCallback"]

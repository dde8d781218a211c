"""Ray Train v2's module paths (``ray.train.v2...``), for code that imports from them: each
module re-exports trainlib's own names. ``ray.train`` -> ``trainlib`` covers the usual paths;
these cover ``from ray.train.v2.api.config import ScalingConfig`` and the like."""

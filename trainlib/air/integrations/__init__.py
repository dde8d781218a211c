"""Ray AIR's integrations with experiment trackers (``ray.air.integrations``), for code ported by
changing imports: ``trainlib.air.integrations.mlflow``, ``trainlib.air.integrations.wandb``.
Each is imported on its own, so importing ``trainlib`` never imports a tracker's package."""

"""``ray.train.v2.api``: the public modules of Ray Train v2, as trainlib's names."""

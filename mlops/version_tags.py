"""The names the registry gives model versions: aliases and tags (no torch: the services'
image, which never loads a model, reads them too)."""

CHAMPION = "champion"
CHALLENGER = "challenger"
ALIASES = (CHAMPION, CHALLENGER)
REQUEST_TAG = "prefect_flow_run_id"  # the flow run that registered a version
WITHDRAWN_TAG = "withdrawn"  # a version taken out of use: a rollback, a duplicate, a sweep
PROMOTION_TAG = "promotion"  # the promote step's decision, recorded on the version
WEIGHTS_TAG = "weights_sha256"  # the classifier file's digest, recorded by the publisher

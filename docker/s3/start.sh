#!/bin/sh
# SeaweedFS's S3 with one identity per service, made from the compose secrets at each start:
#   admin   every bucket, and creating buckets (used by create-buckets only)
#   cifar   the data bucket: the Dask workers and the Prefect worker (data, checkpoints, caches)
#   mlflow  the mlflow bucket: the MLflow server's artifacts
# Keys and secrets are letters and digits (docker/write_secrets.py checks), so they need no
# escaping in JSON. The same script runs chrislusf/seaweedfs (shipped) and the tests' image.
set -eu
secret() { cat "/run/secrets/$1"; }
identity() {  # identity NAME ACCESS SECRET ACTIONS
    printf '{"name": "%s", "credentials": [{"accessKey": "%s", "secretKey": "%s"}], "actions": %s}' \
        "$1" "$(secret "$2")" "$(secret "$3")" "$4"
}
umask 077
{
    printf '{"identities": ['
    identity admin s3_admin_access_key s3_admin_secret_key \
        '["Admin", "Read", "Write", "List", "Tagging"]'
    printf ', '
    identity cifar s3_data_access_key s3_data_secret_key \
        '["Read:cifar", "Write:cifar", "List:cifar", "Tagging:cifar"]'
    printf ', '
    identity mlflow s3_mlflow_access_key s3_mlflow_secret_key \
        '["Read:mlflow", "Write:mlflow", "List:mlflow", "Tagging:mlflow"]'
    printf ']}\n'
} >/tmp/s3.json
exec weed mini -dir=/data -ip=127.0.0.1 -ip.bind=0.0.0.0 -s3.port=9000 -s3.config=/tmp/s3.json \
    -webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0

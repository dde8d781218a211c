#!/bin/sh
# SeaweedFS's S3 with one identity per service, made from the compose secrets at each start:
#   admin   every bucket, and creating buckets (used by create-buckets only)
#   cifar   the data bucket: the Dask workers and the Prefect worker (data, checkpoints, caches)
#   mlflow  the mlflow bucket: the MLflow server's artifacts
#   prefect the prefect bucket: the Prefect worker's cache records (unpickled by flows: out of
#           the Dask workers' reach)
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
    printf ', '
    identity prefect s3_prefect_access_key s3_prefect_secret_key \
        '["Read:prefect", "Write:prefect", "List:prefect", "Tagging:prefect"]'
    printf ']}\n'
} >/tmp/s3.json
# SeaweedFS's gRPC (between its parts, and the S3 gateway's own port, which can replace the
# identities above) takes only the stack's SeaweedFS certificate (docker/certificates.py).
{
    printf '[grpc]\nca = "/run/secrets/s3_grpc_ca"\n'
    for part in master volume filer s3 client; do
        printf '[grpc.%s]\ncert = "/run/secrets/s3_grpc_cert"\nkey = "/run/secrets/s3_grpc_key"\n' "$part"
    done
} >/tmp/security.toml
# The master, volume server and filer listen on loopback only: their HTTP APIs do not check the
# S3 identities. The S3 gateway alone listens on the container's network.
cd /tmp  # SeaweedFS reads ./security.toml
exec weed server -dir=/data -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.volumeSizeLimitMB=1024 \
    -volume.max=0 -filer -s3 -s3.ip.bind=0.0.0.0 -s3.port=9000 -s3.config=/tmp/s3.json \
    -s3.port.iceberg=0 -s3.port.lance=0

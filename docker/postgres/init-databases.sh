#!/bin/sh
# Run once, when the stack's PostgreSQL starts on an empty volume (the official image runs the
# scripts of /docker-entrypoint-initdb.d/): one role per service, owning only its databases,
# with the password of its compose secret; nobody else may connect to them.
#   prefect -> prefect            the Prefect server
#   mlflow  -> mlflow, mlflow_auth  MLflow's tracking store and registry, its users
#   optuna  -> optuna             the weekly search's study
set -eu
psql_admin() {
    psql -v ON_ERROR_STOP=1 -q --username "${POSTGRES_USER:-postgres}" --dbname postgres "$@"
}
service() {  # service ROLE PASSWORD_FILE DATABASE...
    role=$1
    # the password goes from its file to psql's input, never on a command line (`ps` shows those)
    psql_admin -v role="$role" -v file="$2" <<'SQL'
\set password `cat :'file'`
CREATE ROLE :"role" LOGIN PASSWORD :'password';
SQL
    shift 2
    for database in "$@"; do
        psql_admin -c "CREATE DATABASE \"$database\" OWNER \"$role\""
        psql_admin -c "REVOKE ALL ON DATABASE \"$database\" FROM PUBLIC"
    done
}
service prefect /run/secrets/prefect_db_password prefect
service mlflow /run/secrets/mlflow_db_password mlflow mlflow_auth
service optuna /run/secrets/optuna_db_password optuna

#!/bin/sh
# The tests' PostgreSQL image (Debian's postgresql-15, docker/Dockerfile target `postgres`),
# started as the official `postgres` image is: on an empty $PGDATA the cluster is created with
# the superuser's password from $POSTGRES_PASSWORD_FILE (password authentication over the
# network, trust on the container's own socket), the /docker-entrypoint-initdb.d/ scripts run
# once against a server that listens on its socket only, and then the server runs as PID 1.
set -eu
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups sh "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    initdb -D "$PGDATA" -U "${POSTGRES_USER:-postgres}" --pwfile="$POSTGRES_PASSWORD_FILE" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 >/dev/null
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    for script in /docker-entrypoint-initdb.d/*.sh; do
        [ -e "$script" ] && sh "$script"
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec "$@"

#!/bin/sh
# The entry point of compose/postgres.Dockerfile: makes the cluster at the first start
# (the user POSTGRES_USER with the password POSTGRES_PASSWORD, the database POSTGRES_DB),
# then runs the server in the foreground. Connections from the network need the password
# (scram-sha-256); there is no trust authentication.
set -eu

user="${POSTGRES_USER:-patchbox}"
db="${POSTGRES_DB:-patchbox}"
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres: POSTGRES_PASSWORD is empty: set PATCHBOX_DB_PASSWORD" >&2
    exit 64
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 \
        --auth-local=scram-sha-256 --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    {
        echo "host all all 0.0.0.0/0 scram-sha-256"
        echo "host all all ::/0 scram-sha-256"
    } >> "$PGDATA/pg_hba.conf"
    if [ "$db" != "postgres" ]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\";" \
            | postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "postgres: made the cluster (user $user, database $db)" >&2
fi

exec postgres -D "$PGDATA" -c listen_addresses='*' -c port=5432 \
    -c unix_socket_directories=/tmp "$@"

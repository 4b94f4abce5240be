#!/bin/sh
# First-run initialisation of the compose stack's PostgreSQL: mounted into
# /docker-entrypoint-initdb.d, so the image runs it once, as the superuser,
# on an empty data directory. No password is written here: each comes from
# the container's environment, which docker-compose.yml fills from the
# operator's CLAIMFLOW_PG_*_PASSWORD (compose refuses to start without
# them), and reaches the SQL as a psql variable (:'name' quotes it).
#
# claimflow_owner: owns the claimflow database and its schema; only
#   `claimflow migrate` connects as it (the compose service migrate).
# claimflow_app: the runtime role api, worker and consumer connect as. It
#   owns nothing and may not create anything; `claimflow migrate` grants it
#   the DML it needs on claimflow's tables (internal/store/grants.go).
# temporal: owns Temporal's two databases, for temporal-sql-tool and the
#   server.
# None is a superuser, may create databases or roles, replicate or bypass
# row security. These role names are internal/config's DefaultOwnerRole and
# DefaultRuntimeRole; deploy/compose_roles_test.go ties them.
#
# The image executes this file when it is executable and sources it
# otherwise; the work runs in a subshell so neither changes the caller.
(
set -eu
: "${CLAIMFLOW_OWNER_PASSWORD:?the postgres service needs CLAIMFLOW_OWNER_PASSWORD}"
: "${CLAIMFLOW_APP_PASSWORD:?the postgres service needs CLAIMFLOW_APP_PASSWORD}"
: "${TEMPORAL_DB_PASSWORD:?the postgres service needs TEMPORAL_DB_PASSWORD}"

psql --no-psqlrc --set ON_ERROR_STOP=1 \
	--username "${POSTGRES_USER:-postgres}" --dbname postgres \
	--set owner_password="$CLAIMFLOW_OWNER_PASSWORD" \
	--set app_password="$CLAIMFLOW_APP_PASSWORD" \
	--set temporal_password="$TEMPORAL_DB_PASSWORD" <<'SQL'
CREATE ROLE claimflow_owner WITH LOGIN PASSWORD :'owner_password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    CONNECTION LIMIT 10;
CREATE ROLE claimflow_app WITH LOGIN PASSWORD :'app_password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    CONNECTION LIMIT 150; -- leaves room for Temporal under max_connections=300
CREATE DATABASE claimflow OWNER claimflow_owner;
-- No TEMP and no CONNECT for anyone else: only the two roles reach it.
REVOKE ALL ON DATABASE claimflow FROM PUBLIC;
GRANT CONNECT ON DATABASE claimflow TO claimflow_app;

CREATE ROLE temporal WITH LOGIN PASSWORD :'temporal_password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;
REVOKE ALL ON DATABASE temporal FROM PUBLIC;
REVOKE ALL ON DATABASE temporal_visibility FROM PUBLIC;

-- The public schema belongs to the database owner (pg_database_owner,
-- PostgreSQL 15 and later), and PUBLIC may not create in it; said again
-- here so the runtime role can create nothing whatever the version.
\connect claimflow
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- Temporal's visibility schema creates btree_gin if it is missing. It is a
-- trusted extension, so the owner could create it too; doing it here keeps
-- the schema tool from needing that privilege at all.
\connect temporal_visibility
CREATE EXTENSION IF NOT EXISTS btree_gin;
SQL
)

-- First-run initialisation of the compose stack's PostgreSQL (mounted into
-- /docker-entrypoint-initdb.d, so it runs once, as the postgres superuser,
-- on an empty data directory). The passwords are for local development only.
--
-- claimflow_app: the application's role. It owns the claimflow database,
-- so `claimflow migrate` can create tables in its public schema (owned by
-- pg_database_owner since PostgreSQL 15; the role must INHERIT, the default,
-- to use that), and nothing else: no superuser, no CREATEDB, no CREATEROLE,
-- no replication, no access to Temporal's databases.
--
-- temporal: owns Temporal's two databases, for temporal-sql-tool and the
-- server.

\set ON_ERROR_STOP on

CREATE ROLE claimflow_app WITH LOGIN PASSWORD 'claimflow_app'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    CONNECTION LIMIT 150; -- leaves room for Temporal under max_connections=300
CREATE DATABASE claimflow OWNER claimflow_app;
REVOKE ALL ON DATABASE claimflow FROM PUBLIC;

CREATE ROLE temporal WITH LOGIN PASSWORD 'temporal'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;
REVOKE ALL ON DATABASE temporal FROM PUBLIC;
REVOKE ALL ON DATABASE temporal_visibility FROM PUBLIC;

-- Temporal's visibility schema creates btree_gin if it is missing. It is a
-- trusted extension, so the owner could create it too; doing it here keeps
-- the schema tool from needing that privilege at all.
\connect temporal_visibility
CREATE EXTENSION IF NOT EXISTS btree_gin;

#!/bin/sh
# Creates or upgrades Temporal's SQL schemas (temporal, temporal_visibility)
# to the versions shipped in this admin-tools image. Safe to run on every
# `docker compose up`: setup-schema only records version 0.0 on an empty
# database, and update-schema applies only the versions not yet applied.
#
# The databases and their owner role come from deploy/postgres/init.sql.
# Connection: SQL_PLUGIN, SQL_HOST, SQL_PORT, SQL_USER, SQL_PASSWORD (read by
# temporal-sql-tool itself).
set -eu

schema_root=${TEMPORAL_SCHEMA_ROOT:-/etc/temporal/schema/postgresql/v12}

# Postgres reports healthy before it may accept this role for a moment
# after first-run init; retry the first connection briefly.
tries=0
until temporal-sql-tool --db temporal setup-schema -v 0.0; do
	tries=$((tries + 1))
	if [ "$tries" -ge 15 ]; then
		echo "setup-schema: cannot set up database temporal" >&2
		exit 1
	fi
	sleep 2
done
temporal-sql-tool --db temporal update-schema -d "$schema_root/temporal/versioned"

temporal-sql-tool --db temporal_visibility setup-schema -v 0.0
temporal-sql-tool --db temporal_visibility update-schema -d "$schema_root/visibility/versioned"

echo "setup-schema: temporal and temporal_visibility are up to date"

#!/usr/bin/env bash
# Run a production-shaped Temporal server on 127.0.0.1 without Docker: the
# version docker-compose.yml pins (temporalio/server:X -> go.temporal.io/server
# vX), persistence and SQL visibility on an existing PostgreSQL, and frontend,
# matching, worker and two history processes as five OS processes.
#
#   deploy/temporal/server.sh fetch                 # build temporal-server + temporal-sql-tool
#   deploy/temporal/server.sh start --dir DIR (--pg-url URL | --pg-host H --pg-port P
#                                   --pg-user U [--pg-password PW]) [--base-port 17233]
#                                   [--tls TLSDIR]
#   deploy/temporal/server.sh stop --dir DIR
#   deploy/temporal/server.sh kill-node NODE --dir DIR     # kill -9, for fault tests
#   deploy/temporal/server.sh start-node NODE --dir DIR    # restart a stopped node
#   deploy/temporal/server.sh status --dir DIR
#
# NODE is one of frontend, history-1, matching, history-2, worker. Node i (in
# that order) has its gRPC port on base-port+i and its membership port on
# base-port+100+i; the frontend's HTTP API is on base-port+10 and each node's
# Prometheus metrics on base-port+200+i. The default base 17233 stays clear of
# `claimflow dev` (7233, 8233, 8080). `start` creates the databases temporal and
# temporal_visibility if missing, brings their schemas up to date, registers the
# namespace and the search attributes of docker-compose.yml through
# setup-namespace.sh (the compose/k8s setup script), and prints as its last line
#
#   TEMPORAL_ADDRESS=127.0.0.1:17233
#
# --tls TLSDIR requires mutual TLS on every gRPC port, frontend and internode:
# TLSDIR holds ca.pem, and node.pem with node-key.pem, a certificate that CA
# signed for 127.0.0.1 and localhost, usable for server and client auth (the
# nodes present it to each other and the system worker to the frontend).
# Clients need a certificate of that CA; the last lines printed then add the
# TEMPORAL_TLS_* variables of the Temporal CLI and claimflow, with node.pem
# as the client certificate.
#
# Environment:
#   TEMPORAL_NAMESPACE      namespace to register (default: default)
#   TEMPORAL_HISTORY_SHARDS numHistoryShards; fixed once the database exists (default:
#                           docker-compose.yml's NUM_HISTORY_SHARDS)
#   TEMPORAL_CLI            temporal CLI (default: PATH, then the claimflow user cache)
#   TEMPORAL_START_TIMEOUT  seconds to wait for the frontend (default 120)
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/../.." && pwd)"
# One pin: the server image tag in docker-compose.yml.
VERSION="$(sed -n 's|^ *image: *temporalio/server:\([0-9][0-9.]*\) *$|\1|p' "$REPO_DIR/docker-compose.yml" | head -n 1)"
[[ -n "$VERSION" ]] || { echo "server.sh: no temporalio/server image in docker-compose.yml" >&2; exit 1; }
BIN_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/claimflow/temporal-server/v$VERSION"
NODES=(frontend history-1 matching history-2 worker)
# numHistoryShards: compose's too, unless TEMPORAL_HISTORY_SHARDS says otherwise.
SHARDS="${TEMPORAL_HISTORY_SHARDS:-$(sed -n 's|^ *NUM_HISTORY_SHARDS: *"\{0,1\}\([0-9]*\)"\{0,1\} *$|\1|p' "$REPO_DIR/docker-compose.yml" | head -n 1)}"
[[ "$SHARDS" =~ ^[0-9]+$ ]] || { echo "server.sh: no NUM_HISTORY_SHARDS in docker-compose.yml" >&2; exit 1; }
START_TIMEOUT="${TEMPORAL_START_TIMEOUT:-120}"
STOP_TIMEOUT=30
ENV_NAME=production

RUN_DIR="$SCRIPT_DIR/run"
BASE_PORT=17233
PG_HOST=127.0.0.1 PG_PORT=5432 PG_USER=postgres PG_PASSWORD=""
TLS_DIR=""

log() { echo "server.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
	exit 2
}

# ---------------------------------------------------------------- helpers

# parse_pg_url URL: postgres://user[:password]@host[:port][/db][?...] into PG_*.
parse_pg_url() {
	local re='^postgres(ql)?://([^:@/]+)(:([^@/]*))?@([^:/?]+)(:([0-9]+))?(/.*)?$'
	[[ "$1" =~ $re ]] || die "cannot parse --pg-url $1 (want postgres://user[:pw]@host[:port]/...)"
	PG_USER="${BASH_REMATCH[2]}" PG_PASSWORD="${BASH_REMATCH[4]}"
	PG_HOST="${BASH_REMATCH[5]}" PG_PORT="${BASH_REMATCH[7]:-5432}"
}

POSITIONAL=()
parse_opts() {
	POSITIONAL=()
	while (($#)); do
		case "$1" in
		--dir) RUN_DIR="${2:?--dir needs a value}"; shift 2 ;;
		--base-port) BASE_PORT="${2:?--base-port needs a value}"; shift 2 ;;
		--pg-url) parse_pg_url "${2:?--pg-url needs a value}"; shift 2 ;;
		--pg-host) PG_HOST="${2:?}"; shift 2 ;;
		--pg-port) PG_PORT="${2:?}"; shift 2 ;;
		--pg-user) PG_USER="${2:?}"; shift 2 ;;
		--pg-password) PG_PASSWORD="${2?}"; shift 2 ;;
		--tls) TLS_DIR="$(cd "${2:?--tls needs a directory}" && pwd)"; shift 2 ;;
		-h | --help) usage ;;
		-*) die "unknown option $1" ;;
		*) POSITIONAL+=("$1"); shift ;;
		esac
	done
	# Absolute: the server resolves --config relative to --root.
	mkdir -p "$RUN_DIR"
	RUN_DIR="$(cd "$RUN_DIR" && pwd)"
}

need_bins() {
	[[ -x "$BIN_DIR/temporal-server" && -x "$BIN_DIR/temporal-sql-tool" ]] ||
		die "no Temporal $VERSION binaries in $BIN_DIR: run '$0 fetch' first"
}

# The CLI version is the one tools/go.mod pins (`claimflow dev` caches it).
find_cli() {
	if [[ -n "${TEMPORAL_CLI:-}" ]]; then echo "$TEMPORAL_CLI"; return; fi
	local v
	v="$(sed -n 's|^\s*github.com/temporalio/cli \(v[^ ]*\).*|\1|p' "$REPO_DIR/tools/go.mod" | head -n 1)"
	local cached="${XDG_CACHE_HOME:-$HOME/.cache}/claimflow/temporal-cli/$v/temporal"
	if [[ -x "$cached" ]]; then echo "$cached"; elif command -v temporal >/dev/null; then command -v temporal
	else die "temporal CLI not found (set TEMPORAL_CLI, or run 'claimflow dev' once to cache $v)"; fi
}

node_index() {
	local i
	for i in "${!NODES[@]}"; do [[ "${NODES[$i]}" == "$1" ]] && { echo "$i"; return 0; }; done
	die "unknown node '$1' (want one of ${NODES[*]})"
}
node_dir() { echo "$RUN_DIR/nodes/$1"; }
# Each node gets its own config dir: two history processes in one config
# would share services.history.rpc ports.
node_config() { echo "nodes/$1/config"; }
frontend_addr() { echo "127.0.0.1:$BASE_PORT"; }

# tls_env: the variables the Temporal CLI (and claimflow) read to reach a
# --tls cluster, one NAME=value per line; nothing without --tls.
tls_env() {
	[[ -n "$TLS_DIR" ]] || return 0
	printf '%s\n' "TEMPORAL_TLS_SERVER_CA_CERT_PATH=$TLS_DIR/ca.pem" "TEMPORAL_TLS_CLIENT_CERT_PATH=$TLS_DIR/node.pem" \
		"TEMPORAL_TLS_CLIENT_KEY_PATH=$TLS_DIR/node-key.pem" "TEMPORAL_TLS_SERVER_NAME=localhost"
}

# cli ARGS...: the Temporal CLI against this cluster, with its TLS settings.
cli() {
	local -a env=()
	mapfile -t env < <(tls_env)
	env "${env[@]}" "$CLI" "$@"
}

# tls_config: the global.tls section of a node's config under --tls.
tls_config() {
	[[ -n "$TLS_DIR" ]] || return 0
	local server client
	server="{certFile: \"$TLS_DIR/node.pem\", keyFile: \"$TLS_DIR/node-key.pem\", requireClientAuth: true, clientCaFiles: [\"$TLS_DIR/ca.pem\"]}"
	client="{serverName: localhost, rootCaFiles: [\"$TLS_DIR/ca.pem\"]}"
	printf '  tls:\n'
	printf '    internode: {server: %s, client: %s}\n' "$server" "$client"
	printf '    frontend: {server: %s, client: %s}\n' "$server" "$client"
	printf '    systemWorker: {certFile: "%s", keyFile: "%s", client: %s}\n' "$TLS_DIR/node.pem" "$TLS_DIR/node-key.pem" "$client"
}

load_state() {
	[[ -f "$RUN_DIR/cluster.env" ]] || die "no cluster in $RUN_DIR (run '$0 start' first)"
	# shellcheck disable=SC1091
	source "$RUN_DIR/cluster.env"
}

# node_alive NODE: the process launched for NODE is alive. Right after the
# launch its command line may still be nohup's, before it execs the server
# (seen under load), so this checks the launched pid only; node_pid, which
# also guards against a recycled pid, is for later.
node_alive() {
	local f
	f="$(node_dir "$1")/server.pid"
	[[ -f "$f" ]] && kill -0 "$(<"$f")" 2>/dev/null
}

# node_pid NODE: prints the pid if alive and still our temporal-server.
node_pid() {
	local f pid
	f="$(node_dir "$1")/server.pid"
	[[ -f "$f" ]] || return 1
	pid="$(<"$f")"
	[[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
	# Guard against a recycled pid.
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--root $RUN_DIR --config $(node_config "$1") " || return 1
	echo "$pid"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# port_holder PORT: who listens there, when ss can tell.
port_holder() {
	command -v ss >/dev/null || return 0
	ss -ltnpH "sport = :$1" 2>/dev/null | sed -n 's/.*users:(\(.*\))$/ (held by \1)/p' | head -n 1
}

# node_ports NODE: every port the node binds (gRPC, membership, metrics,
# and the frontend's HTTP API).
node_ports() {
	local i
	i="$(node_index "$1")"
	echo $((BASE_PORT + i)) $((BASE_PORT + 100 + i)) $((BASE_PORT + 200 + i))
	[[ $1 == frontend ]] && echo $((BASE_PORT + 10))
	return 0
}

check_ports() { # check_ports NODE...
	local node p
	for node in "$@"; do
		for p in $(node_ports "$node"); do
			port_in_use "$p" && die "$node: port 127.0.0.1:$p is already in use$(port_holder "$p") (move the cluster with --base-port)"
		done
	done
	return 0
}

sql_tool() { # sql_tool DB ARGS...: connection passed by the env vars the tool reads
	local db="$1"; shift
	SQL_PLUGIN=postgres12 SQL_HOST="$PG_HOST" SQL_PORT="$PG_PORT" SQL_USER="$PG_USER" \
		SQL_PASSWORD="$PG_PASSWORD" "$BIN_DIR/temporal-sql-tool" --quiet --db "$db" "$@"
}

schema_step() { # schema_step DB ARGS...
	sql_tool "$@" >>"$RUN_DIR/schema.log" 2>&1 || { tail -n 20 "$RUN_DIR/schema.log" >&2; die "$1: $2 failed"; }
}

# setup_databases: the same steps as setup-schema.sh (compose), with the
# schema files from the module the binaries were built from.
setup_databases() {
	local schema="$BIN_DIR/schema/postgresql/v12" db dir step
	for db in temporal temporal_visibility; do
		[[ $db == temporal ]] && dir="$schema/temporal/versioned" || dir="$schema/visibility/versioned"
		# create-database ignores an existing database; setup-schema -v 0.0 only
		# writes the version tables (a no-op when they exist); update-schema
		# applies the versions not yet applied.
		schema_step "$db" create-database
		schema_step "$db" setup-schema -v 0.0
		schema_step "$db" update-schema -d "$dir"
	done
	log "schemas of temporal and temporal_visibility are up to date (log $RUN_DIR/schema.log)"
}

# One line each, in YAML flow style; keys as in the module's
# config/development-postgres12.yaml.
datastore() { # datastore NAME DB MAXCONNS
	printf '    %s: {sql: {pluginName: postgres12, databaseName: %s, connectAddr: "%s:%s", connectProtocol: tcp, user: "%s", password: "%s", maxConns: %d, maxIdleConns: %d, maxConnLifetime: 1h}}\n' \
		"$1" "$2" "$PG_HOST" "$PG_PORT" "$PG_USER" "$PG_PASSWORD" "$3" "$3"
}

service_rpc() { # service_rpc SERVICE NODE
	local i http=""
	i="$(node_index "$2")"
	[[ $1 == frontend ]] && http=", httpPort: $((BASE_PORT + 10))"
	printf '  %s: {rpc: {grpcPort: %d, membershipPort: %d, bindOnIP: 127.0.0.1%s}}\n' "$1" $((BASE_PORT + i)) $((BASE_PORT + 100 + i)) "$http"
}

write_config() { # write_config NODE
	local node="$1" i dir
	i="$(node_index "$node")"
	dir="$RUN_DIR/$(node_config "$node")"
	mkdir -p "$dir"
	{
		echo "# Written by deploy/temporal/server.sh start for node $node (Temporal $VERSION)"
		printf 'log:\n  stdout: true\n  level: warn\n\n'
		printf 'persistence:\n  defaultStore: postgres-default\n  visibilityStore: postgres-visibility\n'
		printf '  numHistoryShards: %d\n  datastores:\n' "$SHARDS"
		datastore postgres-default temporal 20
		datastore postgres-visibility temporal_visibility 5
		printf '\nglobal:\n  membership:\n    maxJoinDuration: 30s\n    broadcastAddress: 127.0.0.1\n'
		tls_config
		printf '  metrics:\n    prometheus:\n      framework: tally\n      timerType: histogram\n'
		printf '      listenAddress: "127.0.0.1:%d"\n\nservices:\n' $((BASE_PORT + 200 + i))
		service_rpc frontend frontend
		service_rpc matching matching
		service_rpc worker worker
		# This node's own history ports (history-1 for the non-history nodes).
		if [[ $node == history-* ]]; then service_rpc history "$node"; else service_rpc history history-1; fi
		cat <<EOF

clusterMetadata:
  enableGlobalNamespace: false
  failoverVersionIncrement: 10
  masterClusterName: active
  currentClusterName: active
  clusterInformation:
    active:
      enabled: true
      initialFailoverVersion: 1
      rpcName: frontend
      rpcAddress: "$(frontend_addr)"

dcRedirectionPolicy:
  policy: noop

dynamicConfigClient:
  filepath: "$RUN_DIR/dynamicconfig.yaml"
  pollInterval: 10s
EOF
	} >"$dir/$ENV_NAME.yaml"
}

launch_node() { # launch_node NODE: starts the process in the background
	local node="$1" i dir pid p service
	i="$(node_index "$node")"
	dir="$(node_dir "$node")"
	if pid="$(node_pid "$node")"; then die "$node is already running (pid $pid)"; fi
	check_ports "$node"
	service="${node%%-*}"
	nohup "$BIN_DIR/temporal-server" --root "$RUN_DIR" --config "$(node_config "$node")" --env "$ENV_NAME" \
		--allow-no-auth start --service "$service" >>"$dir/server.log" 2>&1 </dev/null &
	echo $! >"$dir/server.pid"
	log "$node: pid $!, gRPC 127.0.0.1:$((BASE_PORT + i)), membership :$((BASE_PORT + 100 + i)), log $dir/server.log"
}

wait_frontend() {
	local deadline=$(($(date +%s) + START_TIMEOUT)) node
	until cli operator cluster health --address "$(frontend_addr)" >/dev/null 2>&1; do
		for node in "${NODES[@]}"; do
			node_alive "$node" || { tail -n 30 "$(node_dir "$node")/server.log" >&2; log "$node exited during startup"; return 1; }
		done
		(($(date +%s) < deadline)) || { log "frontend not healthy within ${START_TIMEOUT}s"; return 1; }
		sleep 1
	done
}

# stop_pids PID...: SIGTERM, wait up to STOP_TIMEOUT, then SIGKILL.
stop_pids() {
	local pids=("$@") alive p deadline=$(($(date +%s) + STOP_TIMEOUT))
	((${#pids[@]})) || return 0
	kill -TERM "${pids[@]}" 2>/dev/null || true
	while alive=() && for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done; ((${#alive[@]})); do
		if (($(date +%s) >= deadline)); then
			log "still running after ${STOP_TIMEOUT}s, sending SIGKILL to ${alive[*]}"
			kill -KILL "${alive[@]}" 2>/dev/null || true
			return 0
		fi
		sleep 0.25
	done
}

stop_all() {
	local node pid pids=()
	for node in "${NODES[@]}"; do pid="$(node_pid "$node")" && pids+=("$pid"); done
	stop_pids "${pids[@]}"
	log "stopped ${#pids[@]} process(es) in $RUN_DIR"
}

# ---------------------------------------------------------------- commands

cmd_fetch() {
	if [[ -x "$BIN_DIR/temporal-server" && -x "$BIN_DIR/temporal-sql-tool" && -d "$BIN_DIR/schema" ]]; then
		log "Temporal $VERSION already in $BIN_DIR, nothing to fetch"
		return 0
	fi
	local t0=$SECONDS
	BUILD_TMP="$(mktemp -d)"
	trap 'rm -rf "$BUILD_TMP"' EXIT
	log "building Temporal server $VERSION into $BIN_DIR (a few minutes) ..."
	# A throwaway module: the server's go.temporal.io/api does not fit the
	# app's go.temporal.io/sdk, so it must not enter the app's module graph.
	# The sql tool imports urfave/cli v1, which the server module requires
	# only for that package, hence the explicit get.
	(
		cd "$BUILD_TMP"
		go mod init temporal-server-build >/dev/null 2>&1
		go get "go.temporal.io/server/cmd/server@v$VERSION" "go.temporal.io/server/cmd/tools/sql@v$VERSION"
		mkdir -p "$BIN_DIR"
		go build -trimpath -o "$BIN_DIR/temporal-server.tmp" go.temporal.io/server/cmd/server
		go build -trimpath -o "$BIN_DIR/temporal-sql-tool.tmp" go.temporal.io/server/cmd/tools/sql
		# The schema files ship in the module; copy them so `start` needs no Go.
		rm -rf "$BIN_DIR/schema"
		cp -r "$(go list -m -f '{{.Dir}}' go.temporal.io/server)/schema" "$BIN_DIR/schema"
		chmod -R u+w "$BIN_DIR/schema"
	) >&2
	mv "$BIN_DIR/temporal-server.tmp" "$BIN_DIR/temporal-server"
	mv "$BIN_DIR/temporal-sql-tool.tmp" "$BIN_DIR/temporal-sql-tool"
	log "built temporal-server and temporal-sql-tool $VERSION in $((SECONDS - t0))s"
}

cmd_start() {
	parse_opts "$@"
	((${#POSITIONAL[@]} == 0)) || die "start: unexpected argument ${POSITIONAL[0]}"
	[[ "$BASE_PORT" =~ ^[0-9]+$ ]] && ((BASE_PORT > 1024 && BASE_PORT + 210 < 65536)) || die "bad --base-port $BASE_PORT"
	need_bins
	CLI="$(find_cli)"
	local node pid t0=$SECONDS
	for node in "${NODES[@]}"; do
		if pid="$(node_pid "$node")"; then die "a cluster is already running in $RUN_DIR ($node, pid $pid): run '$0 stop --dir $RUN_DIR' first"; fi
	done
	# Every node's ports before anything starts: a busy one found halfway
	# would leave the nodes before it running.
	check_ports "${NODES[@]}"
	rm -rf "$RUN_DIR/nodes" "$RUN_DIR/schema.log"
	# The PostgreSQL connection is in the node configs; cluster.env keeps the
	# layout for the other subcommands.
	if [[ -n "$TLS_DIR" ]]; then
		local f
		for f in ca.pem node.pem node-key.pem; do [[ -r "$TLS_DIR/$f" ]] || die "--tls $TLS_DIR has no readable $f"; done
	fi
	printf 'BASE_PORT=%q\nSHARDS=%q\nTLS_DIR=%q\n' "$BASE_PORT" "$SHARDS" "$TLS_DIR" >"$RUN_DIR/cluster.env"
	setup_databases
	# The repo's dynamic config (the one compose mounts) is the base; per
	# stack overrides go in a file after it, so that there is one list.
	{
		echo "# Generated by deploy/temporal/server.sh from $SCRIPT_DIR/dynamicconfig.yaml"
		cat "$SCRIPT_DIR/dynamicconfig.yaml"
	} >"$RUN_DIR/dynamicconfig.yaml"
	for node in "${NODES[@]}"; do mkdir -p "$(node_dir "$node")"; write_config "$node"; done
	# The frontend first: a node that starts on new databases writes the
	# cluster metadata, and two doing it at once make one of them exit
	# ("SaveClusterMetadata encountered version mismatch"). Once it serves,
	# the others start together; they find each other through the
	# cluster_membership table, and setup-namespace.sh retries until they do.
	# From the first launch on, a failed start stops what it launched.
	trap 'rc=$?; if ((rc)); then log "start failed: stopping"; stop_all; fi' EXIT
	launch_node frontend
	local deadline=$(($(date +%s) + START_TIMEOUT))
	until port_in_use "$BASE_PORT"; do
		node_alive frontend || { tail -n 30 "$(node_dir frontend)/server.log" >&2; die "frontend exited during startup"; }
		(($(date +%s) < deadline)) || die "frontend not listening within ${START_TIMEOUT}s"
		sleep 0.2
	done
	for node in "${NODES[@]:1}"; do launch_node "$node"; done
	wait_frontend || exit 1
	log "frontend healthy after $((SECONDS - t0))s; registering namespace and search attributes"
	# setup-namespace.sh (compose, k8s) with compose's list of attributes.
	local attrs retention
	attrs="$(sed -n 's/^ *SEARCH_ATTRIBUTES: *//p' "$REPO_DIR/docker-compose.yml" | head -n 1)"
	retention="$(sed -n 's/^ *RETENTION: *//p' "$REPO_DIR/docker-compose.yml" | head -n 1)"
	mkdir -p "$RUN_DIR/bin"
	ln -sf "$CLI" "$RUN_DIR/bin/temporal"
	local -a tlsvars=()
	mapfile -t tlsvars < <(tls_env)
	if ! env "${tlsvars[@]}" PATH="$RUN_DIR/bin:$PATH" TEMPORAL_ADDRESS="$(frontend_addr)" NAMESPACE="${TEMPORAL_NAMESPACE:-default}" \
		RETENTION="${retention:-72h}" SEARCH_ATTRIBUTES="$attrs" sh "$SCRIPT_DIR/setup-namespace.sh" >&2; then
		die "namespace setup failed"
	fi
	# The forced refresh of the search-attribute cache served the
	# registration just done; under load it costs a database read per
	# request (dynamicconfig.yaml says so), and the nodes re-read this file
	# every pollInterval, so it is off from here on.
	sed -i '/^system.forceSearchAttributesCacheRefreshOnRead:/,/^[^ ]/s/value: true/value: false/' "$RUN_DIR/dynamicconfig.yaml"
	log "Temporal $VERSION up in $((SECONDS - t0))s: ${#NODES[@]} processes, $SHARDS history shards"
	tls_env
	echo "TEMPORAL_ADDRESS=$(frontend_addr)"
}

cmd_stop() {
	parse_opts "$@"
	[[ -f "$RUN_DIR/cluster.env" ]] || { log "no cluster in $RUN_DIR"; return 0; }
	load_state
	stop_all
}

one_node() { # one_node ARGS...: parses options, sets NODE
	parse_opts "$@"
	((${#POSITIONAL[@]} == 1)) || die "want exactly one NODE (${NODES[*]})"
	NODE="${POSITIONAL[0]}"
	node_index "$NODE" >/dev/null
	load_state
}

cmd_kill_node() {
	one_node "$@"
	local pid
	pid="$(node_pid "$NODE")" || die "$NODE is not running"
	kill -KILL "$pid"
	log "killed $NODE (pid $pid) with SIGKILL"
}

cmd_start_node() {
	one_node "$@"
	need_bins
	launch_node "$NODE"
}

cmd_status() {
	parse_opts "$@"
	load_state
	local node pid i down=0
	for node in "${NODES[@]}"; do
		i="$(node_index "$node")"
		if pid="$(node_pid "$node")"; then echo "$node: running, pid $pid, gRPC 127.0.0.1:$((BASE_PORT + i))"
		else echo "$node: stopped"; down=1; fi
	done
	return $down
}

# Subcommand "kill-node" runs cmd_kill_node, and so on.
case "${1:-}" in
fetch | start | stop | kill-node | start-node | status) cmd="cmd_${1//-/_}"; shift; "$cmd" "$@" ;;
*) usage ;;
esac

#!/usr/bin/env bash
# Run a real Apache Kafka broker (4.1.1, KRaft, combined broker+controller) on
# 127.0.0.1 for CI and local tests, without Docker: the jars come from Maven
# Central through pom.xml (see `fetch`).
#
#   deploy/kafka/kafka.sh fetch
#   deploy/kafka/kafka.sh start [--nodes 1|3] [--base-port 19092] [--dir DIR] [--secure]
#   deploy/kafka/kafka.sh stop [--dir DIR]
#   deploy/kafka/kafka.sh kill-node N [--dir DIR]      # kill -9, for fault tests
#   deploy/kafka/kafka.sh start-node N [--dir DIR]     # restart a stopped node
#   deploy/kafka/kafka.sh create-topic NAME PARTITIONS RF [--dir DIR]
#   deploy/kafka/kafka.sh brokers [--dir DIR]          # prints KAFKA_BROKERS=...
#   deploy/kafka/kafka.sh status [--dir DIR]
#
# Node N (0-based) has node.id N, its client listener on base-port+N and its
# controller listener on base-port+100+N. `start` prints the bootstrap list as
# its last line, `KAFKA_BROKERS=127.0.0.1:19092[,...]`, e.g.
#
#   eval "$(deploy/kafka/kafka.sh start | tail -n 1 | sed 's/^/export /')"
#
# --secure makes base-port+N a SASL_SSL listener (SCRAM-SHA-512, user
# claimflow) whose certificate, for 127.0.0.1 and localhost, is signed by a
# CA made with openssl into DIR/tls/ on the first secure start and kept
# (with the user's password) for the next; brokers talk to each other on
# PLAINTEXT base-port+200+N. `start` and `brokers` then print what a client
# needs, one variable a line: KAFKA_BROKERS, KAFKA_TLS_CA_PATH,
# KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD, e.g.
#
#   eval "$(deploy/kafka/kafka.sh start --secure | sed 's/^/export /')"
#
# Environment:
#   KAFKA_HEAP_OPTS   JVM heap of each node   (default -Xms256m -Xmx512m)
#   KAFKA_JVM_OPTS    extra JVM options of each node
#   KAFKA_START_TIMEOUT  seconds to wait for each node to start (default 90)
#   KAFKA_LIB_DIR     where the jars are       (default deploy/kafka/lib)
#   MVN               Maven command            (default mvn)
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_VERSION=4.1.1
LIB_DIR="${KAFKA_LIB_DIR:-$SCRIPT_DIR/lib}"
KAFKA_JAR="kafka_2.13-$KAFKA_VERSION.jar"
LOG4J_CONFIG="$SCRIPT_DIR/log4j2.properties"
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT=30

RUN_DIR="$SCRIPT_DIR/run"
NODES=1
BASE_PORT=19092
SECURE=0
SCRAM_USER=claimflow

log() { echo "kafka.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
	exit 2
}

# ---------------------------------------------------------------- helpers

# parse_opts ARGS...: sets NODES, BASE_PORT, RUN_DIR, SECURE; leftover words go to POSITIONAL.
POSITIONAL=()
parse_opts() {
	POSITIONAL=()
	while (($#)); do
		case "$1" in
		--nodes) NODES="${2:?--nodes needs a value}"; shift 2 ;;
		--nodes=*) NODES="${1#*=}"; shift ;;
		--base-port) BASE_PORT="${2:?--base-port needs a value}"; shift 2 ;;
		--base-port=*) BASE_PORT="${1#*=}"; shift ;;
		--dir) RUN_DIR="${2:?--dir needs a value}"; shift 2 ;;
		--dir=*) RUN_DIR="${1#*=}"; shift ;;
		--secure) SECURE=1; shift ;;
		-h | --help) usage ;;
		--) shift; POSITIONAL+=("$@"); break ;;
		-*) die "unknown option $1" ;;
		*) POSITIONAL+=("$1"); shift ;;
		esac
	done
	# Absolute, so the paths written into server.properties do not depend on
	# the caller's working directory.
	mkdir -p "$RUN_DIR"
	RUN_DIR="$(cd "$RUN_DIR" && pwd)"
}

check_java() {
	command -v java >/dev/null || die "java not found (Kafka $KAFKA_VERSION needs Java 17+)"
	local v
	v="$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
	[[ "${v%%.*}" =~ ^[0-9]+$ ]] && ((${v%%.*} >= 17)) && return 0
	die "Kafka $KAFKA_VERSION brokers need Java 17+, found java.specification.version=${v:-?}"
}

have_jars() { [[ -f "$LIB_DIR/$KAFKA_JAR" && -f "$LIB_DIR/log4j-slf4j-impl-2.24.3.jar" && -f "$LIB_DIR/kafka-tools-$KAFKA_VERSION.jar" ]]; }

need_jars() { have_jars || die "no Kafka jars in $LIB_DIR: run '$0 fetch' first"; }

# Cluster layout written by `start`, read back by the other subcommands.
load_state() {
	[[ -f "$RUN_DIR/cluster.env" ]] || die "no cluster in $RUN_DIR (run '$0 start' first)"
	# shellcheck disable=SC1091
	source "$RUN_DIR/cluster.env"
}

node_dir() { echo "$RUN_DIR/node-$1"; }
node_pid_file() { echo "$RUN_DIR/node-$1/kafka.pid"; }
node_log() { echo "$RUN_DIR/node-$1/server.log"; }

# node_pid N: prints the pid of node N if it is alive (and is our java).
node_pid() {
	local f pid
	f="$(node_pid_file "$1")"
	[[ -f "$f" ]] || return 1
	pid="$(<"$f")"
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	# Guard against a recycled pid: it must be a JVM running our config.
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$(node_dir "$1")/server.properties" || return 1
	echo "$pid"
}

# random_cluster_id: what `kafka-storage random-uuid` prints (16 random bytes,
# URL-safe base64 without padding, not starting with "-"), without a JVM start.
random_cluster_id() {
	local id
	while :; do
		id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
		[[ ${#id} == 22 && "$id" != -* ]] && break
	done
	echo "$id"
}

brokers_list() {
	local i out=()
	for ((i = 0; i < NODES; i++)); do out+=("127.0.0.1:$((BASE_PORT + i))"); done
	(IFS=,; echo "${out[*]}")
}

# admin_list: where the tools connect: the PLAINTEXT inter-broker listeners
# of a secure cluster, the client listeners otherwise.
admin_list() {
	local i out=()
	for ((i = 0; i < NODES; i++)); do out+=("127.0.0.1:$((BASE_PORT + i + 200 * SECURE))"); done
	(IFS=,; echo "${out[*]}")
}

# node_ports N: the ports node N listens on.
node_ports() {
	echo $((BASE_PORT + $1)) $((BASE_PORT + 100 + $1))
	((SECURE == 0)) || echo $((BASE_PORT + 200 + $1))
}

tls_dir() { echo "$RUN_DIR/tls"; }

# make_tls: the CA, the brokers' certificate and key (PKCS#8, which Kafka's
# PEM key store reads), and the SCRAM user's password, made once per DIR.
make_tls() {
	local d
	d="$(tls_dir)"
	if [[ -f "$d/ca.pem" && -f "$d/broker.pem" && -f "$d/scram-password" ]]; then
		log "TLS material and SCRAM password from $d"
		return 0
	fi
	command -v openssl >/dev/null || die "--secure needs openssl"
	mkdir -p "$d"
	chmod 700 "$d"
	(
		cd "$d"
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca-key.pem
		openssl req -x509 -new -key ca-key.pem -subj "/CN=claimflow test Kafka CA" -days 30 \
			-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -out ca.pem
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out broker-key.pem
		openssl req -new -key broker-key.pem -subj "/CN=localhost" -out broker.csr
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >broker.ext
		openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 30 \
			-extfile broker.ext -out broker.pem
		# The key store: the key, then the certificate chain.
		cat broker-key.pem broker.pem >broker-keystore.pem
		openssl rand -hex 16 >scram-password
		chmod 600 ./*.pem scram-password
	) >"$RUN_DIR/tls.log" 2>&1 || {
		cat "$RUN_DIR/tls.log" >&2
		die "making the TLS material in $d failed"
	}
	log "made a CA, a broker certificate for 127.0.0.1 and a SCRAM password in $d"
}

# client_env: what a claimflow process needs to reach the cluster.
client_env() {
	echo "KAFKA_BROKERS=$(brokers_list)"
	((SECURE)) || return 0
	echo "KAFKA_TLS_CA_PATH=$(tls_dir)/ca.pem"
	echo "KAFKA_SASL_MECHANISM=SCRAM-SHA-512"
	echo "KAFKA_SASL_USERNAME=$SCRAM_USER"
	echo "KAFKA_SASL_PASSWORD=$(<"$(tls_dir)/scram-password")"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_config() { # write_config N
	local i="$1" dir voters="" j rf min_isr
	dir="$(node_dir "$i")"
	if ((NODES == 1)); then rf=1 min_isr=1; else rf=3 min_isr=2; fi
	for ((j = 0; j < NODES; j++)); do
		voters+="${voters:+,}$j@127.0.0.1:$((BASE_PORT + 100 + j))"
	done
	mkdir -p "$dir/data"
	{
		echo "# Written by deploy/kafka/kafka.sh start --nodes $NODES --base-port $BASE_PORT$( ((SECURE == 0)) || echo " --secure")"
		echo "process.roles=broker,controller"
		echo "node.id=$i"
		if ((SECURE)); then
			local l="SASL_SSL://127.0.0.1:$((BASE_PORT + i)),PLAINTEXT://127.0.0.1:$((BASE_PORT + 200 + i)),CONTROLLER://127.0.0.1:$((BASE_PORT + 100 + i))"
			echo "listeners=$l"
			echo "advertised.listeners=$l"
			echo "listener.security.protocol.map=SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
			echo "sasl.enabled.mechanisms=SCRAM-SHA-512"
			echo "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
			echo "ssl.keystore.type=PEM"
			echo "ssl.keystore.location=$(tls_dir)/broker-keystore.pem"
		else
			echo "listeners=PLAINTEXT://127.0.0.1:$((BASE_PORT + i)),CONTROLLER://127.0.0.1:$((BASE_PORT + 100 + i))"
			echo "advertised.listeners=PLAINTEXT://127.0.0.1:$((BASE_PORT + i)),CONTROLLER://127.0.0.1:$((BASE_PORT + 100 + i))"
			echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
		fi
		echo "inter.broker.listener.name=PLAINTEXT"
		echo "controller.listener.names=CONTROLLER"
		if ((NODES == 1)); then
			# Dynamic single-voter quorum, formatted with --standalone.
			echo "controller.quorum.bootstrap.servers=127.0.0.1:$((BASE_PORT + 100))"
		else
			# Static quorum of all nodes.
			echo "controller.quorum.voters=$voters"
		fi
		echo "log.dirs=$dir/data"
		echo "auto.create.topics.enable=false"
		echo "num.partitions=1"
		echo "default.replication.factor=$rf"
		echo "min.insync.replicas=$min_isr"
		echo "offsets.topic.replication.factor=$rf"
		echo "offsets.topic.num.partitions=10"
		echo "transaction.state.log.replication.factor=$rf"
		echo "transaction.state.log.min.isr=$min_isr"
		echo "transaction.state.log.num.partitions=10"
		echo "share.coordinator.state.topic.replication.factor=$rf"
		echo "share.coordinator.state.topic.min.isr=$min_isr"
		echo "group.initial.rebalance.delay.ms=0"
		# The log cleaner takes 128 MiB of heap by default: too much for -Xmx512m.
		echo "log.cleaner.dedupe.buffer.size=2097152"
		echo "num.network.threads=2"
		echo "num.io.threads=4"
		echo "num.recovery.threads.per.data.dir=1"
	} >"$dir/server.properties"
}

format_node() { # format_node N CLUSTER_ID
	local i="$1" cid="$2" dir mode=()
	dir="$(node_dir "$i")"
	((NODES == 1)) && mode=(--standalone)
	((SECURE)) && mode+=(--add-scram "SCRAM-SHA-512=[name=$SCRAM_USER,password=$(<"$(tls_dir)/scram-password")]")
	java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
		-Dlog4j2.configurationFile="$LOG4J_CONFIG" -Dkafka.log.level=WARN \
		-cp "$LIB_DIR/*" kafka.tools.StorageTool format \
		--cluster-id "$cid" --config "$dir/server.properties" "${mode[@]}" \
		>"$dir/format.log" 2>&1 || {
		cat "$dir/format.log" >&2
		die "formatting node $i failed"
	}
}

launch_node() { # launch_node N: starts the JVM in the background
	local i="$1" dir pid p
	dir="$(node_dir "$i")"
	if pid="$(node_pid "$i")"; then die "node $i is already running (pid $pid)"; fi
	for p in $(node_ports "$i"); do
		port_in_use "$p" && die "port 127.0.0.1:$p is already in use"
	done
	# shellcheck disable=SC2086 # HEAP_OPTS / KAFKA_JVM_OPTS are word lists
	nohup java $HEAP_OPTS \
		-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
		-Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$LOG4J_CONFIG" \
		-Dkafka.logs.dir="$dir" \
		${KAFKA_JVM_OPTS:-} \
		-cp "$LIB_DIR/*" kafka.Kafka "$dir/server.properties" \
		>>"$(node_log "$i")" 2>&1 </dev/null &
	echo $! >"$(node_pid_file "$i")"
	date +%s >"$dir/started-at"
	log "node $i: pid $!, 127.0.0.1:$((BASE_PORT + i)) (controller :$((BASE_PORT + 100 + i))), log $(node_log "$i")"
}

# wait_started N FROM_LINE: waits until node N's log, past line FROM_LINE,
# says "Kafka Server started".
wait_started() {
	local i="$1" from="$2" logf deadline pid
	logf="$(node_log "$i")"
	deadline=$(($(date +%s) + START_TIMEOUT))
	while :; do
		if tail -n "+$((from + 1))" "$logf" 2>/dev/null | grep -q "Kafka Server started"; then
			return 0
		fi
		if ! pid="$(node_pid "$i")"; then
			log "node $i exited during startup; last lines of $logf:"
			tail -n 40 "$logf" >&2 || true
			return 1
		fi
		if (($(date +%s) >= deadline)); then
			log "node $i (pid $pid) did not start within ${START_TIMEOUT}s; last lines of $logf:"
			tail -n 40 "$logf" >&2 || true
			return 1
		fi
		sleep 0.25
	done
}

log_lines() { if [[ -f "$1" ]]; then wc -l <"$1"; else echo 0; fi; }

# stop_pids PID...: SIGTERM, wait up to STOP_TIMEOUT, then SIGKILL.
stop_pids() {
	local pids=("$@") alive deadline p
	((${#pids[@]})) || return 0
	kill -TERM "${pids[@]}" 2>/dev/null || true
	deadline=$(($(date +%s) + STOP_TIMEOUT))
	while :; do
		alive=()
		for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
		((${#alive[@]})) || return 0
		if (($(date +%s) >= deadline)); then
			log "still running after ${STOP_TIMEOUT}s, sending SIGKILL to ${alive[*]}"
			kill -KILL "${alive[@]}" 2>/dev/null || true
			sleep 0.5
			return 0
		fi
		sleep 0.25
	done
}

# ---------------------------------------------------------------- commands

cmd_fetch() {
	if have_jars; then
		log "jars already in $LIB_DIR ($(find "$LIB_DIR" -name '*.jar' | wc -l) files), nothing to fetch"
		return 0
	fi
	command -v "${MVN:-mvn}" >/dev/null || die "Maven (mvn) not found"
	log "fetching Kafka $KAFKA_VERSION runtime jars from Maven Central into $LIB_DIR ..."
	local t0=$SECONDS
	rm -rf "$LIB_DIR"
	(cd "$SCRIPT_DIR" && "${MVN:-mvn}" -q -B -Dstyle.color=never \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIB_DIR") >&2
	have_jars || die "Maven finished but $LIB_DIR/$KAFKA_JAR is missing"
	log "fetched $(find "$LIB_DIR" -name '*.jar' | wc -l) jars, $(du -sh "$LIB_DIR" | cut -f1), in $((SECONDS - t0))s"
}

cmd_start() {
	parse_opts "$@"
	((${#POSITIONAL[@]} == 0)) || die "start: unexpected argument ${POSITIONAL[0]}"
	[[ "$NODES" == 1 || "$NODES" == 3 ]] || die "--nodes must be 1 or 3"
	if ! [[ "$BASE_PORT" =~ ^[0-9]+$ ]] || ((BASE_PORT <= 1024 || BASE_PORT + 102 + 100 * SECURE >= 65536)); then
		die "bad --base-port $BASE_PORT"
	fi
	check_java
	need_jars
	local i pid p
	if [[ -f "$RUN_DIR/cluster.env" ]]; then
		(
			# shellcheck disable=SC1091
			source "$RUN_DIR/cluster.env"
			for ((i = 0; i < NODES; i++)); do
				if pid="$(node_pid "$i")"; then die "a cluster is already running in $RUN_DIR (node $i, pid $pid): run '$0 stop --dir $RUN_DIR' first"; fi
			done
		)
	fi
	for ((i = 0; i < NODES; i++)); do
		for p in $(node_ports "$i"); do
			port_in_use "$p" && die "port 127.0.0.1:$p is already in use"
		done
	done
	local t0 cid
	t0="$(date +%s.%N)"
	# A fresh cluster every time: old data and logs go (DIR/tls/ stays).
	rm -rf "$RUN_DIR"/node-* "$RUN_DIR/cluster.env"
	((SECURE == 0)) || make_tls
	cid="$(random_cluster_id)"
	printf 'NODES=%s\nBASE_PORT=%s\nCLUSTER_ID=%s\nSECURE=%s\n' "$NODES" "$BASE_PORT" "$cid" "$SECURE" >"$RUN_DIR/cluster.env"
	log "formatting $NODES node(s) in $RUN_DIR, cluster id $cid"
	for ((i = 0; i < NODES; i++)); do
		write_config "$i"
		format_node "$i" "$cid" &
	done
	local failed=0
	for ((i = 0; i < NODES; i++)); do wait -n || failed=1; done
	((failed == 0)) || die "formatting failed"
	# All nodes first: a 3-node quorum needs its peers before any node can finish starting.
	for ((i = 0; i < NODES; i++)); do launch_node "$i"; done
	for ((i = 0; i < NODES; i++)); do
		if ! wait_started "$i" 0; then
			log "start failed: stopping the cluster"
			cmd_stop_loaded
			exit 1
		fi
	done
	local rss=()
	for ((i = 0; i < NODES; i++)); do
		pid="$(node_pid "$i")"
		rss+=("node$i=$(($(awk '/^VmRSS:/{print $2}' "/proc/$pid/status") / 1024))MiB")
	done
	log "$NODES node(s) started in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s (RSS ${rss[*]})"
	client_env
}

cmd_stop_loaded() {
	local i pid pids=()
	for ((i = 0; i < NODES; i++)); do
		if pid="$(node_pid "$i")"; then pids+=("$pid"); fi
	done
	if ((${#pids[@]} == 0)); then
		log "no node running in $RUN_DIR"
	else
		log "stopping node pid(s) ${pids[*]}"
		stop_pids "${pids[@]}"
	fi
	rm -f "$RUN_DIR"/node-*/kafka.pid
}

cmd_stop() {
	parse_opts "$@"
	((${#POSITIONAL[@]} == 0)) || die "stop: unexpected argument ${POSITIONAL[0]}"
	if [[ ! -f "$RUN_DIR/cluster.env" ]]; then
		log "no cluster in $RUN_DIR, nothing to stop"
		return 0
	fi
	load_state
	cmd_stop_loaded
	log "stopped"
}

node_arg() { # node_arg NAME ARGS...: validates the single node number
	local name="$1"
	shift
	((${#POSITIONAL[@]} == 1)) || die "usage: $0 $name N [--dir DIR]"
	local n="${POSITIONAL[0]}"
	[[ "$n" =~ ^[0-9]+$ ]] && ((n < NODES)) && { echo "$n"; return 0; }
	die "$name: node must be 0..$((NODES - 1)), got $n"
}

cmd_kill_node() {
	parse_opts "$@"
	load_state
	local n pid
	n="$(node_arg kill-node)"
	pid="$(node_pid "$n")" || die "node $n is not running"
	kill -KILL "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	rm -f "$(node_pid_file "$n")"
	log "node $n (pid $pid) killed with SIGKILL"
}

cmd_start_node() {
	parse_opts "$@"
	load_state
	check_java
	need_jars
	local n from
	n="$(node_arg start-node)"
	[[ -f "$(node_dir "$n")/server.properties" ]] || die "node $n was never formatted in $RUN_DIR"
	from="$(log_lines "$(node_log "$n")")"
	launch_node "$n"
	wait_started "$n" "$from" || exit 1
	log "node $n started again"
}

cmd_create_topic() {
	parse_opts "$@"
	load_state
	need_jars
	((${#POSITIONAL[@]} == 3)) || die "usage: $0 create-topic NAME PARTITIONS RF [--dir DIR]"
	local name="${POSITIONAL[0]}" parts="${POSITIONAL[1]}" rf="${POSITIONAL[2]}"
	java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
		-Dlog4j2.configurationFile="$LOG4J_CONFIG" -Dkafka.log.level=WARN \
		-cp "$LIB_DIR/*" org.apache.kafka.tools.TopicCommand \
		--bootstrap-server "$(admin_list)" --create --if-not-exists \
		--topic "$name" --partitions "$parts" --replication-factor "$rf"
}

cmd_brokers() {
	parse_opts "$@"
	load_state
	client_env
}

cmd_status() {
	parse_opts "$@"
	load_state
	local i pid rc=0
	for ((i = 0; i < NODES; i++)); do
		if pid="$(node_pid "$i")"; then
			echo "node $i: running pid $pid rss $(($(awk '/^VmRSS:/{print $2}' "/proc/$pid/status") / 1024))MiB 127.0.0.1:$((BASE_PORT + i))"
		else
			echo "node $i: stopped"
			rc=1
		fi
	done
	return $rc
}

(($#)) || usage
cmd="$1"
shift
case "$cmd" in
fetch) cmd_fetch "$@" ;;
start) cmd_start "$@" ;;
stop) cmd_stop "$@" ;;
kill-node) cmd_kill_node "$@" ;;
start-node) cmd_start_node "$@" ;;
create-topic) cmd_create_topic "$@" ;;
brokers) cmd_brokers "$@" ;;
status) cmd_status "$@" ;;
-h | --help | help) usage ;;
*) die "unknown command $cmd" ;;
esac

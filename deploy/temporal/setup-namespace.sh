#!/bin/sh
# Registers the namespace claimflow runs in and the custom search attributes
# its workflows set. Idempotent: what exists is left alone.
#
#   TEMPORAL_ADDRESS    frontend host:port (read by the temporal CLI)
#   TEMPORAL_TLS_*, TEMPORAL_API_KEY  TLS, mTLS or an API key, as claimflow
#                       reads them (so does the temporal CLI)
#   NAMESPACE           namespace to create            (default: default)
#   RETENTION           closed-workflow retention      (default: 72h)
#   SEARCH_ATTRIBUTES   space-separated NAME:TYPE list, e.g. "CourseId:Keyword"
set -eu

ns=${NAMESPACE:-default}
retention=${RETENTION:-72h}

# retry N CMD...: runs CMD until it succeeds, at most N times, 2 s apart.
retry() {
	n=$1
	shift
	i=1
	until "$@"; do
		if [ "$i" -ge "$n" ]; then
			echo "setup-namespace: giving up on: $*" >&2
			return 1
		fi
		i=$((i + 1))
		sleep 2
	done
}

# The frontend port opens before the server can serve requests.
retry 60 temporal operator cluster health >/dev/null

if temporal operator namespace describe --namespace "$ns" >/dev/null 2>&1; then
	echo "setup-namespace: namespace $ns exists"
else
	retry 10 temporal operator namespace create --namespace "$ns" --retention "$retention"
fi

# has_attribute NAME: whether the namespace already has the search attribute.
has_attribute() {
	temporal operator search-attribute list --namespace "$ns" | grep -qw -- "$1"
}

# A namespace created a moment ago may not be in every service's cache yet,
# hence the retries.
add_attribute() {
	has_attribute "$1" || temporal operator search-attribute create --namespace "$ns" --name "$1" --type "$2"
}

for spec in ${SEARCH_ATTRIBUTES:-}; do
	name=${spec%%:*}
	type=${spec#*:}
	if [ -z "$name" ] || [ "$name" = "$spec" ]; then
		echo "setup-namespace: bad SEARCH_ATTRIBUTES entry '$spec', want NAME:TYPE" >&2
		exit 1
	fi
	retry 30 add_attribute "$name" "$type"
	echo "setup-namespace: search attribute $name ($type) present"
done

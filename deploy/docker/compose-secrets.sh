#!/bin/sh
# The fleet's certificates and node tokens for deploy/docker-compose.yml, made by its
# "secrets" service before anything else starts: as root (to hand each file to the user
# that reads it), in the central image (the project's own tools: modelfleet pki,
# modelfleet token, modelfleet node-token). What is there already is kept, so this runs
# at every "up" and changes nothing after the first.
#
# One volume per process, so that no process can read another's key:
#   /pki                 the fleet CA and its private key (this service only)
#   /secrets/central     tls/{cert,key,ca}.pem                      -> central
#   /secrets/edge-X      tls/{cert,key,ca}.pem, node/node-token     -> edge-X
#   /secrets/mosquitto   {cert,key,ca}.pem                          -> the broker
#   /secrets/operator    tls/{cert,key,ca}.pem, prometheus.token    -> Prometheus, and you
# Central's token stores live in its data directory (/var/lib/modelfleet/central).
# (SECRETS_ROOT puts all of these under another directory, and SKIP_CHOWN=1 leaves the
# owners alone: how tests/deploy runs this script outside a container.)
set -eu
umask 077
root=${SECRETS_ROOT:-}
pki=$root/pki
secrets=$root/secrets
data=$root/var/lib/modelfleet/central
edges="edge-a edge-b edge-c"

own() {
    [ -n "${SKIP_CHOWN:-}" ] || chown "$@"
}

# issue OUT OWNER NAME NODE SAN...: NAME's certificate into OUT, owned by OWNER; bound to
# node id NODE unless it is "-" (an edge's: other edges check it when they fetch from it)
issue() {
    out=$1 owner=$2 name=$3 node=$4
    shift 4
    opts=""
    [ "$node" = - ] || opts="--node $node"
    for san in "$@"; do opts="$opts --san $san"; done
    # shellcheck disable=SC2086  # one word per option
    modelfleet pki issue "$name" --ca-dir "$pki" --out "$out" $opts --san localhost --san 127.0.0.1
    own -R "$owner" "$out"
}

issue "$secrets/central/tls" 10001:10001 central - central
issue "$secrets/mosquitto" 1883:1883 mosquitto - mosquitto
issue "$secrets/operator/tls" 65534:65534 operator - operator

mkdir -p "$data"
for edge in $edges; do
    issue "$secrets/$edge/tls" 10001:10001 "$edge" "$edge" "$edge"
    token="$secrets/$edge/node/node-token"
    if [ ! -s "$token" ]; then
        mkdir -p "$secrets/$edge/node"
        modelfleet node-token revoke --node "$edge" --data-dir "$data" >/dev/null 2>&1 || true
        modelfleet node-token create --node "$edge" --data-dir "$data" >"$token.new"
        mv "$token.new" "$token"
    fi
    own -R 10001:10001 "$secrets/$edge"
done

# Prometheus reads central's /metrics (protect_reads) with a viewer token of its own.
scrape="$secrets/operator/prometheus.token"
if [ ! -s "$scrape" ]; then
    modelfleet token revoke --name prometheus --data-dir "$data" >/dev/null 2>&1 || true
    modelfleet token create --name prometheus --role viewer --data-dir "$data" >"$scrape.new"
    mv "$scrape.new" "$scrape"
fi
own 65534:65534 "$scrape"
own 10001:10001 "$data" "$data"/*.json
echo "fleet secrets ready"

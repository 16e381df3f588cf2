#!/bin/sh
# Everything the Kubernetes manifests need from you, made into deploy/k8s/secrets/ (ignored
# by git), from which kustomization.yaml makes the Secrets. Run it on a machine with
# modelfleet installed, with the names of the Kubernetes nodes that run edges (one edge
# per node: its node id and MQTT user name are the node's name):
#
#   deploy/k8s/make-secrets.sh $(kubectl get nodes -o jsonpath='{.items[*].metadata.name}')
#
# It keeps what is there: run it again with a new node's name to add that node, then
# `kubectl apply -k deploy/k8s` (the Secrets get new names, which rolls the pods).
#
#   secrets/ca/                 the fleet CA and its private key: keep it safe, never in the cluster
#   secrets/central/, mosquitto/   cert.pem, key.pem, ca.pem
#   secrets/edges/NODE/         each edge's certificate, bound to its node id (peers check it:
#                               docs/security.md) and valid for *.edge.<namespace>.svc.<cluster domain>
#   secrets/edge-certs.env, edge-keys.env   the same, one base64 line per node (key = node name),
#                               which the edge's init container decodes for its node only
#   secrets/operator/           a client certificate for you and Prometheus (the edges' API wants one)
#   secrets/tokens.json, node_tokens.json   central's token stores (hashes only; empty when
#                               MODELFLEET_STORE__URL puts the tokens in PostgreSQL, as ../k8s-ha/ does)
#   secrets/admin.token, prometheus.token   operator tokens (admin; viewer for scraping)
#   secrets/mqtt-logins.env, mqtt-edge-logins.env, edge-node-tokens.env   broker passwords
#                               (central, one per node) and the edges' node tokens
#
# NAMESPACE (modelfleet) and CLUSTER_DOMAIN (cluster.local) must match the cluster's.
# SECRETS_DIR writes somewhere else than deploy/k8s/secrets (tests/deploy does).
set -eu
umask 077
cd "$(dirname "$0")"
ns=${NAMESPACE:-modelfleet}
domain=${CLUSTER_DOMAIN:-cluster.local}
out=${SECRETS_DIR:-secrets}
mkdir -p "$out"

password() {
    python3 -c 'import secrets; print(secrets.token_hex(24))'
}

issue() {  # issue NAME SAN...
    name=$1
    shift
    sans=""
    for san in "$@"; do sans="$sans --san $san"; done
    # shellcheck disable=SC2086  # one word per SAN
    modelfleet pki issue "$name" --ca-dir "$out/ca" --out "$out/$name" $sans --san localhost --san 127.0.0.1
}

# the last name: each replica of replicated central (../k8s-ha/) advertises <pod IP with dashes> under it
issue central central "central.$ns" "central.$ns.svc" "central.$ns.svc.$domain" \
    "*.central-replicas.$ns.svc.$domain"
issue mosquitto mosquitto "mosquitto.$ns" "mosquitto.$ns.svc" "mosquitto.$ns.svc.$domain"
issue operator operator

token() {  # token NAME ROLE: an operator token, kept in secrets/NAME.token
    [ -s "$out/$1.token" ] && return
    modelfleet token create --name "$1" --role "$2" --tokens-file "$out/tokens.json" >"$out/$1.token"
}
token admin admin
token prometheus viewer
# With MODELFLEET_STORE__URL set (../k8s-ha/make-secrets.sh sets it), the tokens above and the node
# tokens below go to PostgreSQL, where the replicas read them: the files stay empty stores.
[ -s "$out/tokens.json" ] || echo '{"tokens": []}' >"$out/tokens.json"
touch "$out/mqtt-edge-logins.env" "$out/edge-node-tokens.env"
[ -s "$out/node_tokens.json" ] || echo '{"tokens": []}' >"$out/node_tokens.json"
[ -s "$out/mqtt-logins.env" ] || printf 'central=%s\n' "$(password)" >"$out/mqtt-logins.env"

oneline() {  # a file as one base64 line
    base64 <"$1" | tr -d '\n'
}

touch "$out/edge-certs.env" "$out/edge-keys.env"
for node in "$@"; do
    # Edges advertise <pod IP with dashes>.edge.<namespace>.svc.<cluster domain> (edge.yaml)
    modelfleet pki issue "$node" --node "$node" --ca-dir "$out/ca" --out "$out/edges/$node" \
        --san "*.edge.$ns.svc.$domain" --san localhost --san 127.0.0.1
    if ! grep -q "^$node=" "$out/edge-certs.env"; then
        printf '%s=%s\n' "$node" "$(oneline "$out/edges/$node/cert.pem")" >>"$out/edge-certs.env"
        printf '%s=%s\n' "$node" "$(oneline "$out/edges/$node/key.pem")" >>"$out/edge-keys.env"
    fi
    if ! grep -q "^$node=" "$out/mqtt-edge-logins.env"; then
        printf '%s=%s\n' "$node" "$(password)" >>"$out/mqtt-edge-logins.env"
    fi
    if ! grep -q "^$node=" "$out/edge-node-tokens.env"; then
        node_token=$(modelfleet node-token create --node "$node" --node-tokens-file "$out/node_tokens.json")
        printf '%s=%s\n' "$node" "$node_token" >>"$out/edge-node-tokens.env"
    fi
done
echo "secrets ready in $out: kubectl apply -k $(pwd)" >&2

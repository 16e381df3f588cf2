#!/bin/sh
# The Secrets of replicated central (kustomization.yaml here), on top of those of
# ../k8s/make-secrets.sh, which it runs first with the same node names:
#
#   MODELFLEET_STORE__URL='postgresql://USER:PASSWORD@HOST:5432/DB?sslmode=verify-full' \
#   MODELFLEET_BLOBS__ACCESS_KEY=... MODELFLEET_BLOBS__SECRET_KEY=... \
#   deploy/k8s-ha/make-secrets.sh $(kubectl get nodes -o jsonpath='{.items[*].metadata.name}')
#
# The store URL must reach the database from where this runs (a port-forward will do): the
# operator tokens (admin, prometheus) and each node's token are created in PostgreSQL,
# where every replica checks them. The URL the replicas use goes into secrets/store.env;
# STORE_URL_IN_CLUSTER gives another one (the in-cluster name "postgres" of external.yaml)
# when yours differs.
#
#   secrets/store.env              url=<the store URL the replicas use>
#   secrets/s3.env                 access_key=..., secret_key=... (the bucket's credentials)
#   secrets/manifest-signing.key   the Ed25519 key every replica signs manifests with (kept)
#
# SECRETS_DIR and HA_SECRETS_DIR write somewhere else than ../k8s/secrets and ./secrets.
set -eu
umask 077
cd "$(dirname "$0")"
: "${MODELFLEET_STORE__URL:?set MODELFLEET_STORE__URL to the PostgreSQL URL (postgresql://...)}"
: "${MODELFLEET_BLOBS__ACCESS_KEY:?set MODELFLEET_BLOBS__ACCESS_KEY to the bucket's access key}"
: "${MODELFLEET_BLOBS__SECRET_KEY:?set MODELFLEET_BLOBS__SECRET_KEY to the bucket's secret key}"
export MODELFLEET_STORE__URL
out=${HA_SECRETS_DIR:-secrets}
mkdir -p "$out"

SECRETS_DIR=${SECRETS_DIR:-$(pwd)/../k8s/secrets} sh ../k8s/make-secrets.sh "$@"

printf 'url=%s\n' "${STORE_URL_IN_CLUSTER:-$MODELFLEET_STORE__URL}" >"$out/store.env"
printf 'access_key=%s\nsecret_key=%s\n' "$MODELFLEET_BLOBS__ACCESS_KEY" "$MODELFLEET_BLOBS__SECRET_KEY" >"$out/s3.env"
[ -s "$out/manifest-signing.key" ] || openssl genpkey -algorithm ed25519 -out "$out/manifest-signing.key"
echo "replicated central's secrets ready in $out: kubectl apply -k $(pwd)" >&2

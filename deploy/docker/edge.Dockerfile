# syntax=docker/dockerfile:1
# modelfleet edge: OIP v2 inference + /metrics (:8081), gRPC Peer service (:50052), KServe v2 gRPC inference (:8001).
# Build from the repository root:  docker build -f deploy/docker/edge.Dockerfile -t modelfleet-edge .

# --- build: install modelfleet and its dependencies into a virtualenv ---------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/modelfleet
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fleetwire ./fleetwire
COPY central ./central
COPY edge_node ./edge_node
COPY modelfleet ./modelfleet
# the core only: an edge never quantizes or trains (no sympy, no scikit-learn)
RUN /opt/modelfleet/bin/pip install .

# --- runtime: the virtualenv only, run as an unprivileged user ----------------------
FROM python:3.11-slim AS runtime
# libgomp: ONNX Runtime's OpenMP threads on CPU.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 modelfleet \
 && useradd --system --uid 10001 --gid modelfleet --home-dir /var/lib/modelfleet --create-home modelfleet
COPY --from=build /opt/modelfleet /opt/modelfleet
# MODELFLEET_NODE_ID and MODELFLEET_ADVERTISE_HOST differ per edge: set them where it runs,
# and the broker login (MODELFLEET_BROKER__USERNAME = the node id, __PASSWORD).
# Secure by default: it listens on every interface, so its HTTP API and the Peer service
# take only clients with a fleet certificate, and it calls central (gRPC), its peers and
# the broker over TLS with the certificate, key and fleet CA mounted at
# /run/modelfleet/secrets/tls/ (cert.pem, key.pem, ca.pem; the certificate must name
# MODELFLEET_ADVERTISE_HOST), showing the node token in /run/modelfleet/secrets/node/node-token
# (`modelfleet node-token create --node ID` on central's side). Without them it does not
# start; turning TLS off takes MODELFLEET_TLS__ENABLED=false (see docs/security.md).
ENV PATH=/opt/modelfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MODELFLEET_DATA_DIR=/var/lib/modelfleet/edge \
    MODELFLEET_CACHE_DIR=/var/cache/modelfleet \
    MODELFLEET_HTTP_HOST=0.0.0.0 \
    MODELFLEET_HTTP_PORT=8081 \
    MODELFLEET_GRPC_HOST=0.0.0.0 \
    MODELFLEET_GRPC_PORT=50052 \
    MODELFLEET_INFER_GRPC_PORT=8001 \
    MODELFLEET_NODE_TOKEN_FILE=/run/modelfleet/secrets/node/node-token \
    MODELFLEET_TLS__ENABLED=true \
    MODELFLEET_TLS__CERT_FILE=/run/modelfleet/secrets/tls/cert.pem \
    MODELFLEET_TLS__KEY_FILE=/run/modelfleet/secrets/tls/key.pem \
    MODELFLEET_TLS__CA_FILE=/run/modelfleet/secrets/tls/ca.pem \
    MODELFLEET_TLS__REQUIRE_CLIENT_CERT=true \
    MODELFLEET_BROKER__PORT=8883 \
    MODELFLEET_BROKER__TLS__ENABLED=true \
    MODELFLEET_BROKER__TLS__CERT_FILE=/run/modelfleet/secrets/tls/cert.pem \
    MODELFLEET_BROKER__TLS__KEY_FILE=/run/modelfleet/secrets/tls/key.pem \
    MODELFLEET_BROKER__TLS__CA_FILE=/run/modelfleet/secrets/tls/ca.pem
RUN mkdir -p /var/cache/modelfleet && chown 10001:10001 /var/cache/modelfleet
USER 10001:10001
WORKDIR /var/lib/modelfleet
VOLUME ["/var/lib/modelfleet", "/var/cache/modelfleet"]
EXPOSE 8081 50052 8001
# /healthz over HTTPS with the edge's own certificate (its API requires one); plain HTTP when TLS is off
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-m", "modelfleet.healthcheck"]
ENTRYPOINT ["modelfleet", "edge"]

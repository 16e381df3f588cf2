# syntax=docker/dockerfile:1
# modelfleet central: registry REST API + gateway (:8080), gRPC Registry (:50051), gateway over KServe v2 gRPC (:8001).
# Build from the repository root:  docker build -f deploy/docker/central.Dockerfile -t modelfleet-central .

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
# the core, [central] (sympy, for quantization pre-processing; obstore, for chunks on S3) and
# [postgres] (psycopg, for store.url: replicas sharing PostgreSQL); not the demo stack
RUN /opt/modelfleet/bin/pip install '.[central,postgres]'

# --- runtime: the virtualenv only, run as an unprivileged user ----------------------
FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 modelfleet \
 && useradd --system --uid 10001 --gid modelfleet --home-dir /var/lib/modelfleet --create-home modelfleet
COPY --from=build /opt/modelfleet /opt/modelfleet
# Secure by default: it listens on every interface, so operator tokens are required for
# writes and reads (create one: modelfleet token create --data-dir /var/lib/modelfleet/central),
# edges need their node tokens, and gRPC, HTTPS and MQTT are TLS with the certificate,
# key and fleet CA mounted at /run/modelfleet/secrets/tls/ (cert.pem, key.pem, ca.pem;
# `modelfleet pki issue central --out DIR` makes them). Without them central does not
# start. To run without TLS or tokens you must say so: MODELFLEET_TLS__ENABLED=false,
# MODELFLEET_AUTH__ENABLED=false, ... (see docs/security.md).
ENV PATH=/opt/modelfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MODELFLEET_DATA_DIR=/var/lib/modelfleet/central \
    MODELFLEET_HTTP_HOST=0.0.0.0 \
    MODELFLEET_HTTP_PORT=8080 \
    MODELFLEET_GRPC_HOST=0.0.0.0 \
    MODELFLEET_GRPC_PORT=50051 \
    MODELFLEET_GATEWAY__GRPC_PORT=8001 \
    MODELFLEET_AUTH__ENABLED=true \
    MODELFLEET_AUTH__PROTECT_READS=true \
    MODELFLEET_AUTH__NODES_REQUIRED=true \
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
USER 10001:10001
WORKDIR /var/lib/modelfleet
VOLUME ["/var/lib/modelfleet"]
EXPOSE 8080 50051 8001
# /healthz over HTTPS, trusting the fleet CA (or plain HTTP when TLS is turned off)
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-m", "modelfleet.healthcheck"]
ENTRYPOINT ["modelfleet", "central"]

# syntax=docker/dockerfile:1
# modelfleet central: registry REST API + gateway (:8080), gRPC Registry (:50051).
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
# the core and [central] (sympy, for quantization pre-processing); not the demo stack
RUN /opt/modelfleet/bin/pip install '.[central]'

# --- runtime: the virtualenv only, run as an unprivileged user ----------------------
FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 modelfleet \
 && useradd --system --uid 10001 --gid modelfleet --home-dir /var/lib/modelfleet --create-home modelfleet
COPY --from=build /opt/modelfleet /opt/modelfleet
ENV PATH=/opt/modelfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MODELFLEET_DATA_DIR=/var/lib/modelfleet/central \
    MODELFLEET_HTTP_HOST=0.0.0.0 \
    MODELFLEET_HTTP_PORT=8080 \
    MODELFLEET_GRPC_HOST=0.0.0.0 \
    MODELFLEET_GRPC_PORT=50051
USER 10001:10001
WORKDIR /var/lib/modelfleet
VOLUME ["/var/lib/modelfleet"]
EXPOSE 8080 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["modelfleet", "central"]

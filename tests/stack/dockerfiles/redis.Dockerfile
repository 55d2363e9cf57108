# The stack's Redis where redis:7.4-alpine cannot be pulled: Debian bookworm's redis-server (7.0), run as the
# official image runs it: in /data as the user redis, protected mode off when no config file is given (the
# entrypoint), so docker-compose.yml's command and health check (`redis-cli ping`) work unchanged.
ARG BASE=piloop-base:bookworm
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o redis -g redis /data
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["/bin/sh", "/usr/local/bin/docker-entrypoint.sh"]
CMD ["redis-server"]

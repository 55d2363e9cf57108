# The stack's Python base where python:3.11-slim cannot be pulled: Debian bookworm's python3 (3.11), venv, pip and
# git on the debootstrap base, with a venv first on PATH so that the project's Dockerfile's `pip install` installs
# there (Debian's own pip refuses to install into the system's Python, PEP 668). `ca.crt` is the CA bundle of the
# machine that builds it, copied into the build context by tests/stack/images.py and never committed: pip reaches
# the package index through whatever TLS that machine trusts.
ARG BASE=piloop-base:bookworm
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/ssl/certs/piloop-stack-ca.crt \
    SSL_CERT_FILE=/etc/ssl/certs/piloop-stack-ca.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/piloop-stack-ca.crt
COPY ca.crt /etc/ssl/certs/piloop-stack-ca.crt
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-pip git passwd ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/python \
 && python3 --version && git --version

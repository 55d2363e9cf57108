# The stack's S3 endpoint where MinIO's images cannot be pulled: moto's server (PyPI) behind two small commands that
# answer as MinIO's do where docker-compose.yml calls them: `minio server /data …` (the service's command) and `mc`
# (the health check's `mc ready local`, and what deploy/minio-init.sh runs). One image serves both services.
ARG PYTHON=piloop-python:bookworm
FROM ${PYTHON}
RUN pip install --no-cache-dir 'moto[server]>=5' && install -d /data
COPY minio.py /usr/local/bin/minio
COPY mc.py /usr/local/bin/mc
RUN chmod 0755 /usr/local/bin/minio /usr/local/bin/mc
EXPOSE 9000
ENTRYPOINT ["minio"]

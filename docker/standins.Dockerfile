# Stand-ins for the registry images docker-compose.yml names (postgres, redis, minio, mc), for
# nodes that cannot pull them (an air-gapped cluster; the compose test on this machine):
# PostgreSQL and Redis from Debian's packages, an S3 server from Python packages (moto).
#   docker build -f docker/standins.Dockerfile --build-arg BASE_IMAGE=accum-base:bookworm -t accum-standins .
# docker/compose.test.yml runs them in place of the registry images.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV PATH=/opt/s3/bin:/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       postgresql-15 redis-server >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY constraints.txt /tmp/constraints.txt
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=pip_ca \
    export PIP_CERT=$(ls /run/secrets/pip_ca 2>/dev/null || echo /etc/ssl/certs/ca-certificates.crt) \
    && python3 -m venv /opt/s3 && pip install -c /tmp/constraints.txt "moto[server]" boto3
COPY docker/standins/ /usr/local/bin/

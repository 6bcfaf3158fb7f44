#!/usr/bin/env bash
# Make sure a Docker engine with BuildKit and docker-compose is here (sourced by compose_test.sh).
# A fresh machine (Debian, root) gets Debian's docker.io, docker-compose and debootstrap;
# dockerd runs without a bridge or iptables: every container here uses the host's network.
ensure_engine() {
  if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null || ! command -v debootstrap >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "install docker.io, docker-compose and debootstrap (apt, as root)" >&2; return 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null
  fi
  if ! "$DOCKER" info >/dev/null 2>&1; then
    nohup dockerd --bridge=none --iptables=false --ip6tables=false >/var/log/accum-dockerd.log 2>&1 &
    for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
    "$DOCKER" info >/dev/null 2>&1 || { echo "dockerd did not start: see /var/log/accum-dockerd.log" >&2; return 1; }
  fi
}

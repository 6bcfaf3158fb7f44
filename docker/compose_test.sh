#!/usr/bin/env bash
# make compose-test: build the images and run the compose stack end to end on this machine.
#   PYTHON=.venv/bin/python bash docker/compose_test.sh
# 1. a Docker engine (docker/engine.sh: Debian's docker.io when absent; no bridge, no iptables);
# 2. the base image: python:3.11-slim when a registry answers, else accum-base:bookworm made
#    from Debian packages (docker/debian_base.sh);
# 3. accum-api, accum-worker (docker/Dockerfile, from the wheel) and accum-standins, with pip's
#    cache in a BuildKit cache mount and this machine's local wheel index served on loopback;
# 4. tests/deploy/test_compose_stack.py: the stack up, a job through it, torn down;
# 5. tests/deploy/test_wheel.py: the worker image (the wheel alone) runs `accum demo` in an empty folder.
# Each step's seconds are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DOCKER=${DOCKER:-docker}
source docker/engine.sh
declare -a TIMES=()
step() { local name=$1 t0=$SECONDS; shift; "$@"; TIMES+=("$name $((SECONDS - t0)) s"); }

step "engine" ensure_engine

# BuildKit (for the cache mounts): Debian's 20.10 CLI builds with it itself; a newer CLI needs buildx.
BUILDER=$DOCKER
if ! $DOCKER buildx version >/dev/null 2>&1 && [ -x /usr/bin/docker ]; then BUILDER=/usr/bin/docker; fi
export DOCKER_BUILDKIT=1

if [ -z "${BASE_IMAGE:-}" ]; then
  if timeout 60 "$DOCKER" pull -q python:3.11-slim >/dev/null 2>&1; then BASE_IMAGE=python:3.11-slim
  else BASE_IMAGE=accum-base:bookworm; step "base image (debootstrap)" bash docker/debian_base.sh "$BASE_IMAGE"; fi
fi

# pip inside the build reaches the host's loopback (host network): serve the local indexes.
INDEX_LOG=$(mktemp)
"$PYTHON" docker/local_index.py 58101 >"$INDEX_LOG" &
INDEX_PID=$!
trap 'kill $INDEX_PID 2>/dev/null || true; rm -f "$INDEX_LOG"' EXIT
for _ in $(seq 30); do [ -s "$INDEX_LOG" ] || ! kill -0 $INDEX_PID 2>/dev/null && break; sleep 1; done
BUILD_ARGS=(--network=host --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "PIP_EXTRA_INDEX_URL=$(cat "$INDEX_LOG")")
# Behind a TLS-inspecting proxy pip needs the host's CA bundle (PIP_CERT here).
CA=${PIP_CERT:-$("$PYTHON" -m pip config get global.cert 2>/dev/null || true)}
[ -n "$CA" ] && [ -f "$CA" ] && BUILD_ARGS+=(--secret "id=pip_ca,src=$CA")

build() { "$BUILDER" build -q "${BUILD_ARGS[@]}" "$@" . >/dev/null; }
step "build accum-api" build -f docker/Dockerfile --target api -t accum-api:latest
step "build accum-worker" build -f docker/Dockerfile --target worker -t accum-worker:latest
step "build accum-standins" build -f docker/standins.Dockerfile -t accum-standins:latest
"$DOCKER" image prune -f >/dev/null  # the previous builds' images, untagged by these

# What the README promises: the worker's torch is the pin, the API has none.
PIN=$(sed -n 's/^torch==//p' constraints.txt)
GOT=$("$DOCKER" run --rm --network=host accum-worker python -c "import torch; print(torch.__version__)")
[ "${GOT%%+*}" = "$PIN" ] || { echo "accum-worker has torch $GOT, constraints.txt pins $PIN" >&2; exit 1; }
! "$DOCKER" run --rm --network=host accum-api python -c "import torch" 2>/dev/null \
  || { echo "accum-api has torch" >&2; exit 1; }
echo "accum-worker: torch $GOT (pin $PIN); accum-api: no torch"

COMPOSE=${COMPOSE:-docker-compose}
$COMPOSE version >/dev/null 2>&1 || COMPOSE="$DOCKER compose"
export COMPOSE
step "compose stack test" "$PYTHON" -m pytest -m compose -x -q -s -p no:cacheprovider tests/deploy/test_compose_stack.py
step "wheel demo in the worker image" "$PYTHON" -m pytest -m compose -x -q -s -p no:cacheprovider tests/deploy/test_wheel.py
printf '%s\n' "${TIMES[@]}"

#!/bin/sh
# Inside docker/Dockerfile: pip install with the pins, trusting the CA bundle passed as the
# pip_ca build secret when there is one (a TLS-inspecting proxy), else the system's.
#   sh /tmp/accum/install.sh --wheel-of SRC DIST     (build accum's wheel into DIST)
#   sh /tmp/accum/install.sh -r requirements.txt     (the dependencies pyproject names)
#   sh /tmp/accum/install.sh --wheel DIST            (then accum itself, without dependencies)
set -eu
export PIP_CERT="$(ls /run/secrets/pip_ca 2>/dev/null || echo /etc/ssl/certs/ca-certificates.crt)"
if [ "$1" = --wheel-of ]; then
  pip wheel --no-deps -w "$3" "$2"
elif [ "$1" = --wheel ]; then
  pip install --no-deps "$2"/accum-*.whl
  pip check
else
  pip install -c /tmp/accum/constraints.txt "$@"
fi

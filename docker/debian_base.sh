#!/usr/bin/env bash
# A base image made from Debian packages, for nodes that cannot pull from a registry:
#   docker/debian_base.sh [TAG]      (root; default tag accum-base:bookworm)
# then build with --build-arg BASE_IMAGE=accum-base:bookworm. debootstrap fetches Debian's
# own packages (DEBIAN_MIRROR, or a local mirror on an air-gapped cluster); `docker import`
# turns the tree into an image. Python 3.11 is Debian bookworm's python3, as in python:3.11-slim.
set -euo pipefail
TAG=${1:-accum-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG already built"; exit 0
fi
command -v debootstrap >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; }
ROOTFS=$(mktemp -d /var/tmp/accum-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
# minbase: dpkg, apt and what they need; python3-venv gives the image its own virtualenv.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$ROOTFS" "$MIRROR" >/dev/null
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/archives/*.deb
tar -C "$ROOTFS" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$TAG"
echo "built $TAG"

#!/usr/bin/env bash
# Builds the agents' Debian 12 base image without any registry: mmdebstrap
# writes a minimal root filesystem from Debian packages (from the mirror this
# machine's apt configuration names), and the tarball is imported through the
# Docker Engine API on its Unix socket. Idempotent: the image carries the hash of
# this script in a label and is rebuilt only when the script changes.
set -euo pipefail
cd "$(dirname "$0")/.."

SOCK=${DOCKER_SOCKET:-/var/run/docker.sock}
API=v1.41
REPO=choir-base
TAG=bookworm
PACKAGES=bash,coreutils,ripgrep,git,ca-certificates
# `build-base-image.sh python`: the same base with Debian's python3, for MCP
# servers written in Python that run inside the agent's container
# (choir-base:bookworm-python; docs/mcp.md).
case "${1:-}" in
  "") ;;
  python) TAG=bookworm-python; PACKAGES="$PACKAGES,python3" ;;
  *) echo "build-base-image: no variant ${1}; use none or python" >&2; exit 2 ;;
esac
VERSION=$( (cat "$0"; echo "$TAG") | sha256sum | cut -c1-16)

if [ ! -S "$SOCK" ]; then
  echo "build-base-image: no Docker engine socket at $SOCK (set DOCKER_SOCKET, or install and start docker.io)" >&2
  exit 1
fi
api() { curl -sS --unix-socket "$SOCK" "$@"; }
current=$(api "http://localhost/$API/images/$REPO:$TAG/json" | sed -n 's/.*"choir.base.version":"\([0-9a-f]*\)".*/\1/p' | head -n1)
if [ "$current" = "$VERSION" ]; then
  echo "build-base-image: $REPO:$TAG is up to date"
  exit 0
fi

mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^(https?|file):/) {print $i; exit}}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "build-base-image: no Debian mirror in the apt configuration" >&2; exit 1; }

work=$(mktemp -d /tmp/choir-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
mode=()
if [ "$(id -u)" -ne 0 ]; then mode=(--mode=unshare); fi
echo "build-base-image: mmdebstrap bookworm from $mirror ($PACKAGES)"
# Documentation, manuals and locales are left out; copyright files stay.
mmdebstrap "${mode[@]}" --quiet --variant=minbase --include="$PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='chroot "$1" groupadd --gid 10001 choir' \
  --customize-hook='chroot "$1" useradd --uid 10001 --gid 10001 --home-dir /workspace --no-create-home --shell /bin/bash choir' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$work/rootfs.tar" "$mirror"

changes=$(printf '%s' "LABEL choir.base.version=$VERSION" | sed 's/ /%20/g; s/=/%3D/g')
echo "build-base-image: importing $(du -h "$work/rootfs.tar" | cut -f1) into the engine as $REPO:$TAG"
out=$(api -X POST -H 'Content-Type: application/x-tar' --data-binary @"$work/rootfs.tar" \
  "http://localhost/$API/images/create?fromSrc=-&repo=$REPO&tag=$TAG&changes=$changes")
if printf '%s' "$out" | grep -q '"error'; then
  echo "build-base-image: import failed: $out" >&2
  exit 1
fi
api "http://localhost/$API/images/$REPO:$TAG/json" | grep -q "\"choir.base.version\":\"$VERSION\"" \
  || { echo "build-base-image: the imported image lacks its version label" >&2; exit 1; }
echo "build-base-image: done"

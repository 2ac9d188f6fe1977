#!/usr/bin/env bash
# Creates the `choir` system user that the systemd unit runs choird as, and
# lets it use the Docker engine when one is installed. Idempotent.
set -euo pipefail
if ! getent passwd choir >/dev/null; then
  useradd --system --home-dir /var/lib/choir --no-create-home --shell /usr/sbin/nologin choir
  echo "created system user choir"
fi
if getent group docker >/dev/null; then
  usermod -aG docker choir
fi
install -d -o choir -g choir -m 0711 /var/lib/choir

#!/usr/bin/env bash
# Creates the `choir` system user that the systemd unit runs choird as.
# Idempotent. The user is not put in the `docker` group (root-equivalent):
# the unit gives that group to choird alone (SupplementaryGroups=docker).
set -euo pipefail
if ! getent passwd choir >/dev/null; then
  useradd --system --home-dir /var/lib/choir --no-create-home --shell /usr/sbin/nologin choir
  echo "created system user choir"
fi
install -d -o choir -g choir -m 0711 /var/lib/choir

#!/usr/bin/env bash
# Installs the system packages Choir needs on Debian 12, idempotently:
# PostgreSQL 15 with pgvector (built from Debian's own source package, since
# bookworm does not package it), ripgrep, Chromium (the browse tool's
# browser), espeak-ng and opus-tools (the voice tool), dovecot and
# python3-aiosmtpd (the mail tests' servers; their system services are not
# started), python3-venv (the private environment of the AgentDojo replay,
# which tests/agentdojo/setup.sh fills from PyPI), and the build tools.
# Safe to run again: every step checks before it acts.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

PG_MAJOR=15
PACKAGES=(postgresql postgresql-${PG_MAJOR} postgresql-server-dev-${PG_MAJOR} ripgrep
          gcc make dpkg-dev ca-certificates curl git util-linux mount e2fsprogs mmdebstrap chromium
          espeak-ng opus-tools openssl dovecot-imapd dovecot-lmtpd python3-aiosmtpd python3-venv)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  # Packages with services (dovecot) must not start them: the tests run
  # their own, unprivileged. policy-rc.d says so for this install only (a
  # policy already in place is left as it is).
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  status=0
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" || status=$?
  if [ -n "$own_policy" ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
  [ "$status" -eq 0 ] || exit "$status"
fi

# The distribution-wide cluster is not used by Choir (it runs private clusters);
# leave it as the package left it.

# --- Docker engine ----------------------------------------------------------
# Agents run in containers. Debian's docker.io is enough (Engine API 1.41); an
# engine that is already there (Debian's or Docker's own packages) is left alone.
if [ ! -S /var/run/docker.sock ]; then
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "install-deps: installing docker.io"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends docker.io
  fi
  echo "install-deps: starting the Docker engine"
  $SUDO systemctl start docker 2>/dev/null || $SUDO service docker start 2>/dev/null || true
  for _ in $(seq 30); do [ -S /var/run/docker.sock ] && break; sleep 1; done
  [ -S /var/run/docker.sock ] || { echo "install-deps: the Docker engine did not start" >&2; exit 1; }
fi

# --- pgvector -------------------------------------------------------------
SHAREDIR=$(/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config --sharedir)

# Debian 12 does not package pgvector: build Debian's own source package of it.
install_pgvector() {
  # The mirror is whatever this machine's apt configuration names: never hard-coded.
  mirror=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^(https?|file):/) {print $i; exit}}' /etc/apt/sources.list)
  fi
  if [ -z "$mirror" ]; then
    echo "install-deps: cannot find a Debian mirror in /etc/apt/sources.list(.d)" >&2
    exit 1
  fi

  work=$(mktemp -d /tmp/choir-pgvector.XXXXXX)
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/etc/preferences.d" "$work/src"
  # Debian's next release (trixie) carries pgvector 0.8; only its *source* is used,
  # fetched through a private apt state so the system's apt configuration is untouched.
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-trixie-stable.gpg] $mirror trixie main" > "$work/etc/sources.list"
  APT_OPTS=(-o "Dir::Etc::SourceList=$work/etc/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
            -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$work/etc/preferences.d"
            -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "APT::Sandbox::User=$(id -un)")
  echo "install-deps: fetching pgvector source from $mirror (trixie)"
  apt-get "${APT_OPTS[@]}" update -q
  (cd "$work/src" && apt-get "${APT_OPTS[@]}" source -q pgvector)
  srcdir=$(find "$work/src" -maxdepth 1 -mindepth 1 -type d -name 'pgvector-*' | head -n1)
  echo "install-deps: building $(basename "$srcdir")"
  make -C "$srcdir" -s PG_CONFIG=/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config with_llvm=no
  $SUDO make -C "$srcdir" -s PG_CONFIG=/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config with_llvm=no install
  echo "install-deps: pgvector installed"
}

if [ -f "$SHAREDIR/extension/vector.control" ]; then
  echo "install-deps: pgvector already installed"
else
  install_pgvector
fi

# --- Rust -------------------------------------------------------------------
# Debian 12's rustc is too old for the dependency set; a rustup toolchain is
# expected. Install one only when none is there and rustup's server answers.
need_minor=90
if command -v cargo >/dev/null 2>&1; then
  minor=$(cargo --version | awk '{split($2, v, "."); print v[2]}')
  if [ "${minor:-0}" -lt "$need_minor" ]; then
    echo "install-deps: cargo $(cargo --version) is older than 1.$need_minor; run: rustup update stable" >&2
    exit 1
  fi
else
  if curl -fsS --max-time 10 https://sh.rustup.rs -o /tmp/rustup-init.sh; then
    sh /tmp/rustup-init.sh -y --profile minimal --component clippy,rustfmt
    echo "install-deps: Rust installed; add ~/.cargo/bin to PATH (source ~/.cargo/env)"
  else
    echo "install-deps: no cargo on PATH and rustup is unreachable; install Rust >= 1.$need_minor" >&2
    exit 1
  fi
fi

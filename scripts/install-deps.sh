#!/usr/bin/env bash
# Installs the system packages Choir needs on Debian 12, idempotently, in
# three sets (the argument names the widest one wanted; default `test`):
#   runtime  what choird and its agents use at run time: PostgreSQL 15's
#            server (choird runs its own private cluster), ripgrep, git,
#            Chromium (the browse tool), espeak-ng and opus-tools (voice),
#            the workspace quota tools, and Debian's docker.io when no
#            engine runs;
#   build    runtime, plus what `make release` and `make base-image` need:
#            gcc, the server headers and pgvector built from Debian's own
#            source package (bookworm does not package it), mmdebstrap, and
#            a Rust toolchain check;
#   test     build, plus the test suites' own servers and tools: dovecot and
#            python3-aiosmtpd (mail), openssl (their certificates),
#            python3-venv (the AgentDojo replay's private environment),
#            firefox-esr (the console is tested in Firefox as in Chromium).
# Nothing installed here starts a listener: the distribution's PostgreSQL
# cluster is not created, and dovecot's service is neither started nor left
# enabled at boot (the tests run their own, unprivileged, on loopback).
# `make install` never runs this script.
set -euo pipefail

want=${1:-test}
case "$want" in runtime|build|test) ;; *) echo "install-deps: unknown set '$want' (runtime, build or test)" >&2; exit 2;; esac

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

PG_MAJOR=15
RUNTIME_PACKAGES=(postgresql-${PG_MAJOR} ripgrep git ca-certificates util-linux mount e2fsprogs
                  chromium espeak-ng opus-tools)
BUILD_PACKAGES=(postgresql-server-dev-${PG_MAJOR} gcc make dpkg-dev curl mmdebstrap)
TEST_PACKAGES=(dovecot-imapd dovecot-lmtpd python3-aiosmtpd python3-venv openssl firefox-esr)
PACKAGES=("${RUNTIME_PACKAGES[@]}")
if [ "$want" != runtime ]; then PACKAGES+=("${BUILD_PACKAGES[@]}"); fi
if [ "$want" = test ]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  # postgresql-common would create and start a `main` cluster on port 5432
  # that Choir never uses: say no to it before the package is configured.
  if [ ! -e /etc/postgresql-common/createcluster.d/choir.conf ]; then
    $SUDO install -d /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false  # choir runs its own cluster" \
      | $SUDO tee /etc/postgresql-common/createcluster.d/choir.conf >/dev/null
  fi
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
  # A dovecot installed here for the tests is not left enabled at boot (its
  # default configuration listens on every interface).
  if printf '%s\n' "${missing[@]}" | grep -q '^dovecot-'; then
    $SUDO systemctl disable dovecot.service >/dev/null 2>&1 || true
    echo "install-deps: dovecot installed for the tests; its system service is disabled"
  fi
fi

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

if [ "$want" = runtime ]; then
  echo "install-deps: runtime packages in place (pgvector is built and installed by the build set: make build-deps)"
  exit 0
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

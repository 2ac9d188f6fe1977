#!/bin/bash
# setup.sh VENV_DIR — makes VENV_DIR a venv for the MCP tests (Debian's /usr/bin/python3) holding
# exactly requirements.txt. Idempotent: a marker in the venv records the hash of
# requirements.txt and the Python version it was installed for; when it matches,
# nothing is done. Concurrent runs for the same VENV_DIR wait for each other.
# Exits non-zero with a message on stderr when anything fails.
set -euo pipefail

PY=/usr/bin/python3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
req="$here/requirements.txt"

die() {
  echo "mcp setup.sh: $*" >&2
  exit 1
}

[[ $# -eq 1 && -n $1 ]] || die "usage: setup.sh VENV_DIR"
venv=$1
[[ -x $PY ]] || die "$PY not found (Debian's python3 is required)"
[[ -f $req ]] || die "$req not found"

mkdir -p "$venv" || die "cannot create $venv"
venv=$(cd "$venv" && pwd)
marker="$venv/.mcp-requirements"
log="$venv/.mcp-setup.log"
want="$(sha256sum "$req" | cut -d' ' -f1) $("$PY" -c 'import sys; print(sys.version.split()[0])')"

# One setup at a time per venv (tests may start several at once).
exec 9>"$venv/.mcp-setup.lock" || die "cannot open $venv/.mcp-setup.lock"
flock 9 || die "cannot lock $venv/.mcp-setup.lock"

if [[ -x $venv/bin/python && -f $marker && "$(cat "$marker")" == "$want" ]]; then
  exit 0
fi

if [[ ! -x $venv/bin/python ]]; then
  "$PY" -m venv "$venv" || die "'$PY -m venv $venv' failed (is python3-venv installed?)"
fi
rm -f "$marker"
if ! PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
  "$venv/bin/python" -m pip install --quiet -r "$req" >"$log" 2>&1; then
  tail -n 30 "$log" >&2 || true
  die "pip install -r $req into $venv failed (full log: $log)"
fi
if ! "$venv/bin/python" -c 'import mcp_server_time, mcp_server_git, mcp.server.mcpserver' >>"$log" 2>&1; then
  tail -n 30 "$log" >&2 || true
  die "the MCP servers do not import in $venv (log: $log)"
fi
echo "$want" >"$marker"

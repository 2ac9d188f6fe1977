#!/bin/sh
# Installs the systems `make bench-peers` compares Choir with, pinned, into
# private directories under DIR (default target/peers): nanobot from PyPI in
# a virtual environment of its own, ZeroClaw from crates.io with its own
# lock file (--locked) and target directory. Nothing is installed system-
# wide; a version already in place is kept. ZeroClaw's build takes a while
# (about 770 crates, fat LTO) the first time.
set -eu
NANOBOT=0.3.5
ZEROCLAW=0.1.7
dir=${1:-target/peers}
mkdir -p "$dir"

if "$dir/nanobot-venv/bin/nanobot" --version 2>/dev/null | grep -q "v$NANOBOT\$" &&
   "$dir/nanobot-venv/bin/python" -c 'import aiohttp' 2>/dev/null; then
  echo "install-peers: nanobot $NANOBOT is in place"
else
  echo "install-peers: nanobot $NANOBOT from PyPI into $dir/nanobot-venv"
  python3 -m venv "$dir/nanobot-venv"
  # The [api] extra: `nanobot serve`, its OpenAI-compatible Agent API.
  "$dir/nanobot-venv/bin/pip" install --quiet --disable-pip-version-check "nanobot-ai[api]==$NANOBOT"
fi

if "$dir/zeroclaw/bin/zeroclaw" --version 2>/dev/null | grep -q " $ZEROCLAW\$"; then
  echo "install-peers: zeroclaw $ZEROCLAW is in place"
else
  echo "install-peers: zeroclaw $ZEROCLAW from crates.io into $dir/zeroclaw (a long build the first time)"
  cargo install zeroclaw --version "=$ZEROCLAW" --locked --root "$dir/zeroclaw" --target-dir "$dir/zeroclaw-build"
fi

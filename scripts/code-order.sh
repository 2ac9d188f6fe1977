#!/usr/bin/env bash
# `make code-order`: writes code-order/choird.order and
# code-order/choir-agent.order, the functions each binary runs once start-up
# is over, then those only start-up runs, from a profile of `bench-soak`'s
# ordinary use (the build script code-order/build.rs links
# release builds in that order).
#
# How: the release build `make release` makes, with its symbols kept
# (`RUSTFLAGS=-C strip=none` does not enter cargo's `-C metadata`, so the
# symbol names, hashes included, are the release build's), in its own target
# directory; `bench-soak` (short mode) run on copies of it with choird and
# choir-agent under valgrind's callgrind, which starts a new part of its
# profile where `choir_common::code_pages::give_back_logged` returns (the
# end of start-up); `scripts/code_order.py` turns the parts into the lists.
# Run it again after a dependency or toolchain update (a stale list only
# costs resident memory; DESIGN.md, "Measurements", says how much).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if ! command -v valgrind >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "code-order: installing valgrind"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends valgrind
fi

export CARGO_TARGET_DIR="$root/target/code-order"
export RUSTFLAGS="-C strip=none"
# Exactly `make release`'s two invocations (features unify per invocation,
# and features enter the symbol hashes).
cargo build --workspace --release --bins --exclude choir-agent
cargo build --release -p choir-agent
unset RUSTFLAGS CARGO_TARGET_DIR

work=$(mktemp -d /tmp/choir-code-order.XXXXXX)
trap 'rm -rf "$work"' EXIT
bin="$root/target/code-order/release"
mkdir "$work/profile"
cp "$bin/bench-soak" "$bin/choirctl" "$work/"
for b in choird choir-agent; do
  cp "$bin/$b" "$work/$b.real"
  # choird finds choir-agent beside its own executable; valgrind reports the
  # profiled program's path as /proc/self/exe, so the wrapper is found.
  cat > "$work/$b" <<WRAP
#!/bin/sh
exec valgrind --tool=callgrind --demangle=no --dump-instr=no \\
  --dump-after='*give_back_logged*' --dump-every-bb=50000000 \\
  --log-file="$work/profile/$b.%p.log" \\
  --callgrind-out-file="$work/profile/$b.%p" "$work/$b.real" "\$@"
WRAP
  chmod 755 "$work/$b"
done

echo "code-order: bench-soak under callgrind (several minutes)"
"$work/bench-soak"

# Both lists or neither: written beside the profile, moved at the end.
shopt -s nullglob
for b in choird choir-agent; do
  parts=("$work"/profile/$b.*[0-9])
  [ ${#parts[@]} -gt 0 ] || { echo "code-order: no profile of $b" >&2; exit 1; }
  python3 scripts/code_order.py --binary "$work/$b.real" --out "$work/$b.order" "${parts[@]}"
done
mkdir -p code-order
mv "$work/choird.order" "$work/choir-agent.order" code-order/
echo "code-order: done; rebuild with make release"

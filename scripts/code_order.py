#!/usr/bin/env python3
"""Turns callgrind profiles of one binary into a symbol ordering file for lld.

Used by scripts/code-order.sh (`make code-order`). Each
profile file is one part of one process's run; the part whose trigger was
`--dump-after` ends start-up (the profile was split where
`give_back_logged` returns). Written, one mangled symbol a line:

  1. the binary's functions that ran after start-up, by their own cost,
     highest first (what steady turns keep resident, the hottest together);
  2. then those only start-up ran (given back after start-up: kept apart
     from the first group so none of them shares its pages).

The rest of the binary follows in the linker's own order.
"""

import argparse
import collections
import re
import sys

NAMED = re.compile(r"^(c?fn|c?ob|fl|fi|fe|cfi|cfl)=\((\d+)\)(?: (.*))?$")


def header(path):
    """(pid, part number) from a profile file's head."""
    pid, part = None, 1
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("pid:"):
                pid = int(line.split()[1])
            elif line.startswith("part:"):
                part = int(line.split()[1])
            elif line.startswith(("fn=", "ob=")):
                break
    return pid, part


def read_parts(paths, binary):
    """[(ends start-up, {symbol: own cost})] of one process's parts, in order.

    Callgrind compresses names across the parts of one process: `fn=(12)`
    may name a function defined in an earlier part, so the parts are read in
    order with one table of names.
    """
    names = {"fn": {}, "ob": {}}
    parts = []
    for path in paths:
        trigger = ""
        ob = fn = None
        costs = collections.Counter()
        skip_next = False
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if skip_next:  # the inclusive cost of a call, not the caller's own
                    skip_next = False
                    continue
                if line.startswith("desc: Trigger:"):
                    trigger = line
                elif line.startswith("calls="):
                    skip_next = True
                elif m := NAMED.match(line):
                    kind, ident, name = m.groups()
                    space = "fn" if kind.endswith("fn") else "ob" if kind.endswith("ob") else None
                    if space is None:
                        continue
                    if name is not None:
                        names[space][ident] = name
                    if kind == "ob":
                        ob = names["ob"].get(ident)
                    elif kind == "fn":
                        fn = names["fn"].get(ident)
                elif line[:1].isdigit() or line[:1] in "+-*":
                    fields = line.split()
                    if fn is not None and ob == binary and len(fields) >= 2:
                        costs[fn] += int(fields[-1])
        own = collections.Counter()
        for name, cost in costs.items():
            if not name.startswith(("0x", "(")):  # no symbol; "(below main)"
                own[name.split("'")[0]] += cost  # recursion levels: name'2
        parts.append(("--dump-after" in trigger, own))
    return parts


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--binary", required=True, help="the profiled executable's path")
    args.add_argument("--out", required=True)
    args.add_argument("profiles", nargs="+")
    a = args.parse_args()

    by_pid = collections.defaultdict(list)
    for path in a.profiles:
        pid, part = header(path)
        by_pid[pid].append((part, path))
    steady, startup = collections.Counter(), collections.Counter()
    processes = 0
    for pid, files in sorted(by_pid.items()):
        parts = read_parts([path for _, path in sorted(files)], a.binary)
        ends = [i for i, (ends_startup, _) in enumerate(parts) if ends_startup]
        if not ends:
            print(f"code_order: process {pid} never finished start-up; left out", file=sys.stderr)
            continue
        processes += 1
        for i, (_, own) in enumerate(parts):
            (startup if i <= ends[-1] else steady).update(own)
    if not steady:
        sys.exit("code_order: no steady-state profile found")
    only_startup = {s: c for s, c in startup.items() if s not in steady}
    with open(a.out, "w", encoding="utf-8") as out:
        out.write("# Written by `make code-order` (scripts/code-order.sh): the functions\n")
        out.write(f"# {len(steady)} ran after start-up in bench-soak ({processes} processes),\n")
        out.write(f"# then {len(only_startup)} only start-up ran. Linked first, in this order,\n")
        out.write("# by code-order/build.rs; a name the binary lacks is skipped.\n")
        for s, _ in sorted(steady.items(), key=lambda kv: (-kv[1], kv[0])):
            out.write(s + "\n")
        for s, _ in sorted(only_startup.items(), key=lambda kv: (-kv[1], kv[0])):
            out.write(s + "\n")
    print(f"code_order: {a.out}: {len(steady)} steady, {len(only_startup)} start-up only")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Trial of pgvector index kinds for agent memory at scale.

Not part of choird: a developer's measurement of what each index kind gives
at the size the issue names, on a scratch PostgreSQL cluster of its own
(started here, removed at the end). For each kind it reports the build
time and size, recall@10 against an exact scan and query latency at three
search widths, and the rate of inserts of 100 items a statement into the
indexed table (the cost every upsert's vector pays once it is indexed).

    make index-trial ARGS='--index ivfflat --data clustered'

Index kinds: `hnsw` (what choird ships: vector_cosine_ops, m, ef_construction),
`hnsw-bq` (HNSW over `binary_quantize(e)::bit(D)` with bit_hamming_ops, the
candidates re-ranked by exact cosine distance), `ivfflat` (lists = n / 1000
unless given). Data: `clustered` (around 1,000 random centres, noise 0.6,
as bench-memory's CHOIR_BENCH_DATA=clustered) or `uniform` on the sphere.
Needs numpy and psycopg (`make index-trial` makes a private environment in
target/) and PostgreSQL with pgvector >= 0.7 (scripts/install-deps.sh).
"""

import argparse
import glob
import os
import shlex
import shutil
import signal
import statistics
import sys
import struct
import subprocess
import tempfile
import time

import numpy as np
import psycopg


def vectors(rng, centres, n, dims):
    """n unit vectors, big-endian float32: clustered when centres is given."""
    v = rng.standard_normal((n, dims)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    if centres is not None:
        v = centres[rng.integers(0, len(centres), n)] + 0.6 * v
        v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v.astype(">f4")


def write_copy(path, chunks, dims):
    """A COPY ... (FORMAT binary) file of one vector column."""
    head = struct.pack(">hi", 1, 4 + 4 * dims) + struct.pack(">hh", dims, 0)
    with open(path, "wb") as f:
        f.write(b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0))
        for chunk in chunks:
            for row in chunk:
                f.write(head)
                f.write(row.tobytes())
        f.write(struct.pack(">h", -1))


def pg_bindir():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise SystemExit("no PostgreSQL server found under /usr/lib/postgresql (run scripts/install-deps.sh)")
    return os.path.dirname(found[-1])


def as_postgres(argv, check=True):
    """Runs argv as the postgres user when this runs as root (PostgreSQL
    refuses to run as root), else as this user."""
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--"] + argv
    return subprocess.run(argv, check=check, stdout=subprocess.DEVNULL).returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--data", choices=["clustered", "uniform"], default="clustered")
    ap.add_argument("--index", choices=["hnsw", "hnsw-bq", "ivfflat"], default="hnsw")
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--ef-construction", type=int, default=128)
    ap.add_argument("--lists", type=int, default=0, help="ivfflat lists (default n / 1000)")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--inserts", type=int, default=2000)
    a = ap.parse_args()
    if a.n < 1000 or a.queries < 1 or a.inserts < 100 or a.inserts % 100:
        raise SystemExit("--n >= 1000, --queries >= 1, --inserts a multiple of 100")

    rng = np.random.default_rng(7)
    unit = rng.standard_normal((1000, a.dims)).astype(np.float32)
    centres = unit / np.linalg.norm(unit, axis=1, keepdims=True) if a.data == "clustered" else None
    # SIGTERM ends the run through `finally`, so the cluster never outlives it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    work = tempfile.mkdtemp(prefix="choir-index-trial-")
    os.chmod(work, 0o755)
    data = os.path.join(work, "pgdata")
    bindir = pg_bindir()
    started = False
    ok = False
    try:
        write_copy(os.path.join(work, "items.bin"),
                   (vectors(rng, centres, min(50_000, a.n - i), a.dims) for i in range(0, a.n, 50_000)), a.dims)
        write_copy(os.path.join(work, "more.bin"), [vectors(rng, centres, a.inserts, a.dims)], a.dims)
        write_copy(os.path.join(work, "q.bin"), [vectors(rng, centres, a.queries, a.dims)], a.dims)
        for f in ("items.bin", "more.bin", "q.bin"):
            os.chmod(os.path.join(work, f), 0o644)
        os.mkdir(data)
        if os.geteuid() == 0:
            shutil.chown(work, "postgres")
            shutil.chown(data, "postgres")
        as_postgres([f"{bindir}/initdb", "-D", data, "-U", "postgres", "-A", "trust"])
        # From here on the cluster may be running (pg_ctl -w can time out
        # while the postmaster still starts): `finally` stops it either way.
        started = True
        opts = f"-c listen_addresses= -k {shlex.quote(work)} -c maintenance_work_mem=1GB -c jit=off"
        as_postgres([f"{bindir}/pg_ctl", "-D", data, "-l", f"{work}/pg.log", "-w", "start", "-o", opts])
        c = psycopg.connect(f"host={work} user=postgres dbname=postgres", autocommit=True)
        x = c.execute
        x("CREATE EXTENSION vector")
        for t in ("items", "more", "q"):
            x(f"CREATE TABLE {t} (id bigserial PRIMARY KEY, e vector({a.dims}))")
            x(f"COPY {t}(e) FROM '{work}/{t}.bin' (FORMAT binary)")
            os.remove(os.path.join(work, f"{t}.bin"))
        x("VACUUM ANALYZE items")
        print(f"{a.n} {a.data} vectors of {a.dims} dimensions, index {a.index}, shared_buffers "
              f"{x('SHOW shared_buffers').fetchone()[0]}", flush=True)
        qs = [r[0] for r in x("SELECT e::text FROM q ORDER BY id").fetchall()]
        t0 = time.time()
        truth = [{r[0] for r in x("SELECT id FROM items ORDER BY e <=> %s::vector LIMIT 10", (q,)).fetchall()}
                 for q in qs]
        print(f"exact scan: {(time.time() - t0) * 1000 / len(qs):.1f} ms a query", flush=True)

        bits = f"binary_quantize(e)::bit({a.dims})"
        if a.index == "hnsw":
            index = f"hnsw (e vector_cosine_ops) WITH (m = {a.m}, ef_construction = {a.ef_construction})"
            widths, knob = (40, 100, 200), "ef_search"
            query = "SELECT id FROM items ORDER BY e <=> %s::vector LIMIT 10"
        elif a.index == "hnsw-bq":
            index = f"hnsw (({bits}) bit_hamming_ops) WITH (m = {a.m}, ef_construction = {a.ef_construction})"
            widths, knob = (40, 100, 200), "candidates re-ranked"
            query = (f"SELECT id FROM (SELECT id, e FROM items ORDER BY {bits} <~> binary_quantize(%s::vector) "
                     "LIMIT {w}) s ORDER BY e <=> %s::vector LIMIT 10")
        else:
            lists = a.lists or max(a.n // 1000, 1)
            index = f"ivfflat (e vector_cosine_ops) WITH (lists = {lists})"
            widths, knob = (10, 20, 40), "probes"
            query = "SELECT id FROM items ORDER BY e <=> %s::vector LIMIT 10"
        t0 = time.time()
        x(f"CREATE INDEX items_e ON items USING {index}")
        size = x("SELECT pg_size_pretty(pg_relation_size('items_e'))").fetchone()[0]
        print(f"index {index}: built in {time.time() - t0:.1f} s, {size}", flush=True)

        def search(label):
            for w in widths:
                if a.index == "ivfflat":
                    x(f"SET ivfflat.probes = {w}")
                else:
                    x(f"SET hnsw.ef_search = {w}")
                lat, rec = [], []
                for q, tr in zip(qs, truth):
                    args = (q, q) if a.index == "hnsw-bq" else (q,)
                    s = time.perf_counter()
                    ids = {r[0] for r in x(query.replace("{w}", str(w)), args).fetchall()}
                    lat.append((time.perf_counter() - s) * 1000)
                    rec.append(len(ids & tr) / 10)
                lat.sort()
                p = lambda f: lat[int((len(lat) - 1) * f)]
                print(f"{label}, {knob} {w}: recall@10 {statistics.mean(rec):.3f}, "
                      f"p50 {p(0.5):.2f} ms, p99 {p(0.99):.2f} ms", flush=True)

        search("queries")
        t0 = time.time()
        for k in range(a.inserts // 100):
            x(f"INSERT INTO items(e) SELECT e FROM more WHERE id > {k * 100} AND id <= {k * 100 + 100}")
        print(f"{a.inserts} inserts, 100 a statement, index maintained: "
              f"{a.inserts / (time.time() - t0):.0f} items/s", flush=True)
        search("queries after the inserts (their recall against the items before them)")
        ok = True
    finally:
        if started:
            as_postgres([f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], check=False)
            if not ok and os.path.exists(f"{work}/pg.log"):
                with open(f"{work}/pg.log", errors="replace") as log:
                    sys.stderr.write("PostgreSQL's log, last lines:\n" + "".join(log.readlines()[-20:]))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

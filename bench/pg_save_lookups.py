#!/usr/bin/env python3
"""Round trips and time of a ~1,000-chunk save into a store with a PostgreSQL catalog, for each
kvsnap binary given (e.g. one built before the batched chunk lookup, Catalog::find_chunks, and one
after). Starts its own PostgreSQL (tests/beds/postgres.sh) on 127.0.0.1; blobs in a local directory.

    bench/pg_save_lookups.py KVSNAP [KVSNAP...]

Per binary, on a fresh database: save a 1,024-chunk state (every chunk new), then save it again under
another name (every chunk known: the dedup path). Round trips are counted as the database's committed
transactions (pg_stat_database.xact_commit: each statement outside BEGIN..COMMIT is one, each
BEGIN..COMMIT one more), read after the kvsnap process exits (its backends flush their counters)."""
import json, os, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fleet"))
from fleet_test import make_slot, start_postgres  # noqa: E402


def sql(url, q):
    return subprocess.run(["psql", "-XAtq", url, "-c", q], capture_output=True, text=True, check=True).stdout.strip()


def commits(url, db):
    time.sleep(0.7)  # backends flush their counters as they exit
    return int(sql(url, f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{db}'"))


def main():
    bins = sys.argv[1:]
    if not bins:
        sys.exit(__doc__)
    work = Path(tempfile.mkdtemp(prefix="kvsnap-lookups-"))
    pg, url = start_postgres(Path("/tmp") / f"kvsnap-lookups-pg-{os.getpid()}")  # the server's user must reach it
    try:
        slot = work / "state.slot"
        make_slot(slot, seed=7, cells=1024)  # 4 layers x K,V x 1024/8 cells: 1,024 chunks
        for i, kv in enumerate(bins):
            db = f"lookups{i}"
            sql(url, f"CREATE DATABASE {db}")
            dburl = url[: url.rfind("/") + 1] + db
            store = work / f"store{i}"
            store.mkdir()
            (store / "store.json").write_text(json.dumps({"catalog": dburl}))
            subprocess.run([kv, "ls", "--store", str(store)], capture_output=True, check=True)  # schema
            for name in ("new", "known"):
                before = commits(url, db)
                t0 = time.monotonic()
                p = subprocess.run([kv, "save", str(slot), "--name", name, "--cells-per-chunk", "8", "--json", "-q",
                                    "--store", str(store)], capture_output=True, text=True)
                dt = time.monotonic() - t0
                if p.returncode != 0:
                    sys.exit(f"{kv}: save failed: {p.stderr}")
                r = json.loads(p.stdout)
                after = commits(url, db)
                print(f"{kv}  save {name:5}  chunks {r.get('n_chunks')}  new {r.get('chunks_new')}  "
                      f"round trips {after - before}  {dt:.2f} s", flush=True)
    finally:
        subprocess.run(["bash", str(HERE.parent / "tests/beds/postgres.sh"), "stop", str(pg)], capture_output=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The multi-host proof (issue 16 part 4): two "hosts" share one store, a PostgreSQL catalog and an
S3-compatible bucket, and save, restore, remove and collect garbage at once, with kill -9 in the
middle of saves and of gc.

A host is a store config of its own (same catalog URL, same bucket and prefix, its own local_dir:
staging of packs, the read-through cache, restore temporaries) used by separate kvsnap processes.
Run inside the Swift bed (tests/beds/swift-s3.sh run DIR auto python3 fleet_test.py KVSNAP WORK);
the driver starts its own PostgreSQL (tests/beds/postgres.sh) and stops it when it exits.

    fleet_test.py KVSNAP WORK_DIR [--seed N] [--save-kills N] [--gc-kills N]

Phases (each ends with check_store(): verify, doctor, exact refcounts, every listed snapshot
restored byte for byte on a host whose cache is empty, nothing committed lost):
  d  cross-host: A saves, B restores (empty cache), B removes, A no longer lists it, its objects go
  a  concurrency: both hosts save (fixtures, unique and shared-prefix states) while others restore
  b  kill -9 during saves on A while B runs gc --wait and gc, over and over
  c  kill -9 during gc on B while A saves
  s  staged packs: a save killed on A once its pack's upload holds a part leaves nothing on A, and
     B's gc aborts the upload once older than multipart_max_age; a live save stopped on A with an
     older stage is left alone by B's gc and, continued, commits and restores on B byte for byte
and at the end a final gc from both hosts, after which the bucket holds exactly what the catalog
names and no incomplete upload. Then the same kill -9 phases (fewer rounds) on an encrypted store
(its own database and prefix, key_file + tenant), with the same checks made with the key:
  e  A saves with the key, B restores, a host without the key is refused, no object holds plaintext
  eb, ec  kill -9 during saves and during gc, then check_store with the key and check_bucket
Exit 0 when every check held, 1 otherwise, 77 (skip) when PostgreSQL is not installed.
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loopback import free_port  # noqa: E402  (tests/loopback.py)

SRC = Path(__file__).resolve().parents[2]
PSQL = os.environ.get("KVSNAP_PG_BIN", "/usr/lib/postgresql/15/bin") + "/psql"
PREFIX = "fleet"
SEALED = "sealed"  # the encrypted store's prefix
MULTIPART_MAX_AGE = 2  # seconds: gc aborts older incomplete uploads (the store configs say so)
# How long after an upload starts gc sees it as stale: Swift (2.30+, s3api's S3Timestamp) lists its
# start rounded UP to the second, and gc aborts an upload whose start, to the second, is strictly
# before now - MULTIPART_MAX_AGE cut DOWN to the second (S3BlobStore::abort_stale_uploads), so it
# takes up to MULTIPART_MAX_AGE + 2 s after the upload started (the sleeps start later still).
STALE_UPLOAD_WAIT = MULTIPART_MAX_AGE + 2.5
failures = []
figures = {}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def check(ok, what):
    if not ok:
        failures.append(what)
        log("FAIL: " + what)
    return ok


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


# ---------------------------------------------------------------- state files

def make_slot(path, seed, cells, n_layer=4, n=256, prefix_seed=None, prefix_cells=0):
    """A ggsq v3 slot file (llama.cpp's layout, as tests/tools/make_big_slot.py writes it): q8_0 K and
    V rows (scale 1/64, random int8 from `seed`), random tokens. With prefix_seed, the first
    prefix_cells cells (tokens and rows) come from that seed: files sharing it share those chunks."""
    row = n // 32 * 34
    pre = random.Random(prefix_seed) if prefix_seed is not None else None
    pc = prefix_cells if pre else 0
    rng = random.Random(seed)

    def rows(r, k):
        b = bytearray(r.randbytes(k * row))
        b[0::34] = b"\x00" * (k * row // 34)
        b[1::34] = b"\x24" * (k * row // 34)
        return bytes(b)

    raw = (pre.randbytes(4 * pc) if pc else b"") + rng.randbytes(4 * (cells - pc))
    toks = struct.pack(f"<{cells}i", *(1 + v % 30000 for v in struct.unpack(f"<{cells}I", raw)))
    with open(path, "wb") as f:
        f.write(struct.pack("<III", 0x67677371, 3, cells))
        f.write(toks)
        f.write(struct.pack("<II", 1, cells))
        f.write(b"".join(struct.pack("<iIi", c, 1, 0) for c in range(cells)))
        f.write(struct.pack("<II", 0, n_layer))
        for _side in range(2):
            for _il in range(n_layer):
                f.write(struct.pack("<iQ", 8, row))
                if pc:
                    f.write(rows(pre, pc))
                f.write(rows(rng, cells - pc))


# ---------------------------------------------------------------- the servers

def start_postgres(d):
    """The server's data lives in `d` (postgres.sh stop removes it)."""
    p = subprocess.run(["bash", str(SRC / "tests/beds/postgres.sh"), "start", str(d), str(free_port()),
                        str(os.getpid())], capture_output=True, text=True)
    if p.returncode == 77:
        print("SKIP: PostgreSQL 15 is not installed (tests/install-deps.sh installs it)", flush=True)
        sys.exit(77)
    if p.returncode != 0:
        sys.exit("postgres bed failed: " + p.stderr)
    return d, p.stdout.strip()


def sql(url, query):
    p = subprocess.run([PSQL, url, "-qAt", "-v", "ON_ERROR_STOP=1", "-c", query], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"psql {query!r}: {p.stderr}")
    return [l.split("|") for l in p.stdout.splitlines() if l]


class Swift:
    """The bucket seen through Swift's own API (tempauth), not through the code under test."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        req = urllib.request.Request(endpoint + "/auth/v1.0",
                                     headers={"X-Auth-User": "test:tester", "X-Auth-Key": "testing"})
        with urllib.request.urlopen(req, timeout=30) as r:
            self.token = r.headers["X-Auth-Token"]
            self.url = r.headers["X-Storage-Url"]

    def call(self, method, path, query=""):
        req = urllib.request.Request(self.url + "/" + path + ("?" + query if query else ""), method=method,
                                     headers={"X-Auth-Token": self.token})
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read()

    def create(self, bucket):
        self.call("PUT", bucket)

    def keys(self, container, prefix):
        out, marker = [], ""
        while True:
            try:
                body = self.call("GET", container, urllib.parse.urlencode(
                    {"format": "json", "prefix": prefix, "marker": marker, "limit": "10000"}))
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return out
                raise
            page = [o["name"] for o in json.loads(body)]
            if not page:
                return out
            out += page
            marker = page[-1]


# ---------------------------------------------------------------- hosts

class Host:
    def __init__(self, name, work, catalog, blobs, extra=None):
        self.name = name
        self.dir = work / ("host-" + name)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.config = str(self.dir / "store.json")
        with open(self.config, "w") as f:
            json.dump({"catalog": catalog, "blobs": blobs, "local_dir": str(self.dir / "local"), **(extra or {})}, f)
        self.cache = self.dir / "local" / "s3-cache"
        self.staging = self.dir / "local" / "tmp" / "s3-packs"

    def cmd(self, *args):
        return [KV, *args, "--store", self.config]

    def run(self, *args, timeout=600):
        return subprocess.run(self.cmd(*args), capture_output=True, text=True, timeout=timeout, env=ENV)

    def spawn(self, *args):
        return subprocess.Popen(self.cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)

    def ls(self):
        p = self.run("ls", "--json")
        if not check(p.returncode == 0, f"{self.name}: ls: {p.stderr}"):
            return []
        return json.loads(p.stdout)

    def cache_entries(self):
        return [f for f in self.cache.iterdir()] if self.cache.is_dir() else []

    def clear_cache(self):
        shutil.rmtree(self.cache, ignore_errors=True)


class Registry:
    """What was saved: snapshot name -> the original file and its SHA-256; which saves exited 0."""

    def __init__(self):
        self.files = {}
        self.committed = set()
        self.checked = set()  # restored byte for byte on a host with an empty cache
        self.lock = threading.Lock()

    def add(self, name, path):
        with self.lock:
            self.files[name] = (path, sha256_of(path))

    def save(self, host, name, *extra):
        p = host.run("save", self.files[name][0], "--name", name, "--json", "-q", *extra)
        ok = check(p.returncode == 0, f"{host.name}: save {name}: exit {p.returncode}: {p.stderr.strip()}")
        if ok:
            with self.lock:
                self.committed.add(name)
        return ok


def restore_matches(host, reg, name, out):
    p = host.run("restore", name, "-o", str(out), "--force", "-q")
    if not check(p.returncode == 0, f"{host.name}: restore {name}: exit {p.returncode}: {p.stderr.strip()}"):
        return False
    ok = check(sha256_of(out) == reg.files[name][1], f"{host.name}: restore {name} differs from the original")
    out.unlink()
    return ok


# ---------------------------------------------------------------- the checks

def check_store(label, hosts, fresh, reg, url, everything=False):
    """The store is whole: catalog consistent, refcounts exact, every listed snapshot restores byte for
    byte on a host with an empty cache (those not restored by an earlier check, or all of them), nothing
    that a host saved (exit 0) is missing."""
    a, b = hosts
    t0 = time.time()
    p = a.run("verify", "--all", "--json", "-q")
    check(p.returncode == 0, f"{label}: verify --all: exit {p.returncode}: {p.stdout[-2000:]} {p.stderr.strip()}")
    p = b.run("doctor", "--json")
    if check(p.returncode == 0, f"{label}: doctor: exit {p.returncode}: {p.stdout[-2000:]}"):
        bad = [c for c in json.loads(p.stdout)["checks"] if c["verdict"] != "ok"]
        check(not bad, f"{label}: doctor: {bad}")
    wrong = sql(url, "SELECT encode(c.sha256, 'hex'), c.refcount, COUNT(sc.sha256) FROM chunks c "
                     "LEFT JOIN snapshot_chunks sc ON sc.sha256 = c.sha256 GROUP BY c.sha256, c.refcount "
                     "HAVING c.refcount != COUNT(sc.sha256)")
    check(not wrong, f"{label}: refcounts differ from the uses: {wrong[:5]}")
    listed_a = {s["name"]: s["uuid"] for s in a.ls()}
    listed_b = {s["name"]: s["uuid"] for s in b.ls()}
    check(listed_a == listed_b, f"{label}: A and B list different snapshots")
    lost = reg.committed - set(listed_a)
    check(not lost, f"{label}: saves that exited 0 are not listed: {sorted(lost)}")
    unknown = set(listed_a) - set(reg.files)
    check(not unknown, f"{label}: listed snapshots nobody saved: {sorted(unknown)}")
    fresh.clear_cache()
    n = 0
    for name in sorted(set(listed_a) & set(reg.files)):
        if everything or name not in reg.checked:
            n += restore_matches(fresh, reg, name, fresh.dir / "out.slot")
            reg.checked.add(name)
    fresh.clear_cache()
    log(f"{label}: store checked: {len(listed_a)} snapshots listed, {n} restored byte for byte on host "
        f"{fresh.name} (empty cache), {time.time() - t0:.1f} s")
    return listed_a


def check_bucket(label, swift, bucket, url, hosts, prefix=PREFIX):
    """After a final gc (no save running): the bucket holds exactly the packs and loose blobs the
    catalog names; no chunk row is unreferenced; no host keeps a staged pack; no upload is left."""
    keys = swift.keys(bucket, prefix + "/")
    packs = {k.rsplit("/", 1)[1] for k in keys if k.startswith(prefix + "/packs/")}
    loose = {k.rsplit("/", 1)[1] for k in keys if k.startswith(prefix + "/chunks/")}
    named = {r[0] + ".pack" for r in sql(url, "SELECT DISTINCT pack FROM chunks WHERE pack IS NOT NULL")}
    named_loose = {r[0] for r in sql(url, "SELECT encode(sha256, 'hex') FROM chunks WHERE pack IS NULL")}
    check(packs == named, f"{label}: bucket packs {len(packs)} != catalog packs {len(named)}: "
                          f"extra {sorted(packs - named)[:5]}, missing {sorted(named - packs)[:5]}")
    check(loose == named_loose, f"{label}: loose blobs in the bucket differ from the catalog's")
    zero = sql(url, "SELECT COUNT(*) FROM chunks WHERE refcount = 0")[0][0]
    check(zero == "0", f"{label}: {zero} unreferenced chunk rows left after gc")
    for h in hosts:
        check(not staged(h), f"{label}: host {h.name} keeps staged packs {staged(h)[:3]}")
    uploads = in_progress_uploads(swift, bucket, prefix)
    check(not uploads, f"{label}: incomplete uploads left after gc: {sorted(uploads)[:3]}")
    log(f"{label}: bucket holds {len(packs)} packs, {len(loose)} loose blobs, exactly the catalog's; "
        f"{len(uploads)} incomplete uploads left")
    figures[label + ": packs"] = len(packs)


# ---------------------------------------------------------------- the phases

def phase_cross_host(a, b, reg, url, swift, bucket, files):
    """d: A saves, B restores with an empty cache, B removes, A no longer lists it, its objects go."""
    path = files / "cross.slot"
    make_slot(path, seed=1, cells=1024)
    reg.add("cross", str(path))
    reg.save(a, "cross")
    b.clear_cache()
    check(not b.cache_entries(), "d: host B's cache is not empty before its restore")
    restore_matches(b, reg, "cross", b.dir / "cross.out")
    check(len(b.cache_entries()) > 0, "d: host B's restore did not read through its cache (no entries)")
    packs = {r[0] for r in sql(url, "SELECT DISTINCT c.pack FROM chunks c JOIN snapshot_chunks sc ON "
                                    "sc.sha256 = c.sha256 JOIN snapshots s ON s.id = sc.snapshot_id "
                                    "WHERE s.name = 'cross'")}
    check(len(packs) == 1 and all(swift.keys(bucket, f"{PREFIX}/packs/{p}") for p in packs),
          f"d: the snapshot's pack is not in the bucket: {packs}")
    p = b.run("rm", "cross")
    check(p.returncode == 0, f"d: B rm cross: {p.stderr}")
    reg.committed.discard("cross")
    del reg.files["cross"]
    check("cross" not in {s["name"] for s in a.ls()}, "d: A still lists a snapshot B removed")
    p = a.run("gc", "--wait", "--json", "-q")
    check(p.returncode == 0, f"d: A gc: {p.stderr}")
    left = [p for p in packs if swift.keys(bucket, f"{PREFIX}/packs/{p}")]
    check(not left, f"d: after B's rm and A's gc the pack is still in the bucket: {left}")
    log("d: cross-host save/restore/rm/gc done")


def phase_concurrency(a, b, reg, files, rng):
    """a: three savers per host (fixtures, unique and shared-prefix states) and two restorers per host
    running at once; every restore is byte for byte."""
    fixtures = sorted(SRC.glob("fixtures/v0.5.0/*.slot")) + sorted(SRC.glob("fixtures/b8390/*.slot"))
    jobs = {a: [], b: []}
    for i, fx in enumerate(fixtures[:8]):
        name = f"fx-{fx.parent.name}-{fx.stem}"
        reg.add(name, str(fx))
        jobs[a if i % 2 == 0 else b].append(name)
    for i in range(6):  # four cells of every six share a prefix: their first chunks dedup across hosts
        path = files / f"family-{i}.slot"
        make_slot(path, seed=100 + i, cells=1024, prefix_seed=99, prefix_cells=768)
        reg.add(f"family-{i}", str(path))
        jobs[a if i % 2 == 0 else b].append(f"family-{i}")
        path = files / f"unique-{i}.slot"
        make_slot(path, seed=200 + i, cells=1536)
        reg.add(f"unique-{i}", str(path))
        jobs[a if i % 2 else b].append(f"unique-{i}")
    done = threading.Event()
    restores = {"ok": 0, "failed": 0}
    rlock = threading.Lock()

    def saver(host, names):
        for name in names:
            reg.save(host, name)

    def restorer(host, k):
        out = host.dir / f"restore-{k}.slot"
        r = random.Random(k)
        while not done.is_set():
            listed = [s["name"] for s in host.ls() if s["name"] in reg.files]
            if not listed:
                time.sleep(0.05)
                continue
            ok = restore_matches(host, reg, r.choice(listed), out)
            with rlock:
                restores["ok" if ok else "failed"] += 1

    threads = []
    for host in (a, b):
        names = jobs[host]
        rng.shuffle(names)
        for k in range(3):
            threads.append(threading.Thread(target=saver, args=(host, names[k::3])))
    restorers = [threading.Thread(target=restorer, args=(h, f"{h.name}{k}")) for h in (a, b) for k in range(2)]
    t0 = time.time()
    for t in threads + restorers:
        t.start()
    for t in threads:
        t.join()
    done.set()
    for t in restorers:
        t.join()
    n = len(jobs[a]) + len(jobs[b])
    figures["a: concurrent saves"] = n
    figures["a: concurrent restores (byte for byte)"] = restores["ok"]
    check(restores["ok"] > 0, "a: no restore ran during the saves")
    shared = sql(URL, "SELECT COUNT(*) FROM chunks WHERE refcount >= 6")[0][0]
    check(int(shared) > 0, "a: the six shared-prefix states share no chunk (no dedup across hosts)")
    figures["a: chunks shared by all six family states"] = int(shared)
    log(f"a: {n} saves from 6 processes on 2 hosts with {restores['ok']} concurrent restores, "
        f"{shared} chunks shared by the 6 states of 2 hosts, {time.time() - t0:.1f} s")


def staged(host):
    """Packs staged on the host's disk (kvsnap stages them in the bucket: always none)."""
    return sorted(p.name for p in host.staging.iterdir() if ".pack" in p.name) if host.staging.is_dir() else []


def in_progress_uploads(swift, bucket, prefix=PREFIX):
    """The incomplete multipart uploads of packs under `prefix`, upload id -> parts sent, as Swift's
    s3api keeps them: a marker object <key>/<upload id> in the bucket's +segments container from
    CreateMultipartUpload until the upload is completed or aborted, each part at <key>/<id>/<n>."""
    base = prefix + "/packs/"
    markers, parts = set(), {}
    for k in swift.keys(bucket + "+segments", base):
        p = k[len(base):].split("/")
        if len(p) == 2:
            markers.add(p[1])
        elif len(p) == 3:
            parts[p[1]] = parts.get(p[1], 0) + 1
    return {u: parts.get(u, 0) for u in markers}


def phase_kill_saves(a, b, reg, files, rng, attempts, url, swift, bucket, prefix=PREFIX, label="b",
                     seconds=240, seed=0):
    """b: saves on A killed with SIGKILL at random moments while B runs gc --wait and gc in a loop."""
    sizes = [(6144, 1024), (10240, 1024)]  # 51 MB and 85 MB: packs of several 16 MiB parts
    # One uninterrupted save of each size: how long the window to kill in is.
    durations = []
    for i, (cells, n) in enumerate(sizes):
        path = files / f"{label}-big-ref-{i}.slot"
        make_slot(path, seed=seed + 300 + i, cells=cells, n=n)
        reg.add(f"big-ref-{i}", str(path))
        t0 = time.time()
        reg.save(a, f"big-ref-{i}")
        durations.append(time.time() - t0)
    figures[f"{label}: uninterrupted save seconds (51 MB, 85 MB)"] = [round(d, 2) for d in durations]
    stop = threading.Event()
    gcs = {"runs": 0, "failed": 0}

    def gc_loop():
        k = 0
        while not stop.is_set():
            args = ("gc", "--wait", "--json", "-q") if k % 2 == 0 else ("gc", "--json", "-q")
            p = b.run(*args)
            gcs["runs"] += 1
            if not check(p.returncode == 0, f"{label}: B {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}"):
                gcs["failed"] += 1
            k += 1

    gc_thread = threading.Thread(target=gc_loop)
    gc_thread.start()
    phases = {}
    deadline = time.time() + seconds
    try:
        for i in range(attempts):
            if time.time() > deadline:
                break
            cells, n = sizes[i % 2]
            name = f"killed-{i}"
            path = files / f"{label}-{name}.slot"
            make_slot(path, seed=seed + 1000 + i, cells=cells, n=n)
            reg.add(name, str(path))
            before = set(swift.keys(bucket, prefix + "/packs/"))
            uploads_before = set(in_progress_uploads(swift, bucket, prefix))
            proc = a.spawn("save", str(path), "--name", name, "--json", "-q")
            time.sleep(rng.uniform(0.0, 1.2 * durations[i % 2]))
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate()
            if proc.returncode == 0:
                reg.committed.add(name)
                phase = "finished before the kill"
            elif proc.returncode != -signal.SIGKILL:
                check(False, f"{label}: save {name} failed on its own: exit {proc.returncode}: {err.strip()}")
                phase = "failed"
            elif name in {s["name"] for s in a.ls()}:
                phase = "killed after the catalog commit"  # committed: it must stay listed
                reg.committed.add(name)
            else:
                new = set(swift.keys(bucket, prefix + "/packs/")) - before
                check(not staged(a), f"{label}: killed save {name} left a pack on host A: {staged(a)}")
                if new:
                    phase = "killed after the pack upload, before the commit"
                elif set(in_progress_uploads(swift, bucket, prefix)) - uploads_before:
                    phase = "killed while its pack's upload was in progress"
                else:
                    phase = "killed before a part of its pack went up (gc may have aborted it)"
            phases[phase] = phases.get(phase, 0) + 1
            if name not in reg.committed:
                del reg.files[name]
                path.unlink()
    finally:
        stop.set()
        gc_thread.join()
    figures[f"{label}: kill -9 during save, by phase"] = phases
    figures[f"{label}: gc runs on B meanwhile"] = gcs["runs"]
    check(gcs["runs"] > 0, f"{label}: no gc ran on B")
    log(f"{label}: {sum(phases.values())} saves killed at random moments on A: {phases}; {gcs['runs']} gc runs on B")


def unnamed_packs(swift, bucket, url, prefix=PREFIX):
    keys = {k.rsplit("/", 1)[1] for k in swift.keys(bucket, prefix + "/packs/")}
    return keys - {r[0] + ".pack" for r in sql(url, "SELECT DISTINCT pack FROM chunks WHERE pack IS NOT NULL")}


def phase_kill_gc(a, b, reg, files, rng, attempts, url, swift, bucket, prefix=PREFIX, label="c", seconds=180,
                  seed=0):
    """c: gc on B killed with SIGKILL at random moments while A saves; the garbage is the chunks and
    packs of snapshots B removed just before (many small chunks each)."""
    stop = threading.Event()
    saved = {"n": 0}

    def save_loop():
        k = 0
        while not stop.is_set():
            name = f"during-gc-{k}"
            path = files / f"{label}-{name}.slot"
            make_slot(path, seed=seed + 2000 + k, cells=2048)
            reg.add(name, str(path))
            if reg.save(a, name):
                saved["n"] += 1
            k += 1

    outcomes = {}
    saver = threading.Thread(target=save_loop)
    saver.start()
    deadline = time.time() + seconds
    try:
        for i in range(attempts):
            if time.time() > deadline:
                break
            names = []
            for j in range(3):
                name = f"garbage-{i}-{j}"
                path = files / f"{label}-{name}.slot"
                make_slot(path, seed=seed + 3000 + 10 * i + j, cells=1024)
                reg.add(name, str(path))
                if reg.save(a, name, "--cells-per-chunk", "8"):
                    names.append(name)
            p = b.run("rm", *names)
            check(p.returncode == 0, f"{label}: B rm {names}: {p.stderr.strip()}")
            for name in names:
                reg.committed.discard(name)
                del reg.files[name]
            # rm collects what it freed unless a save holds the gc lock (A's save loop does, at
            # random): then the gc below has those chunk rows and packs to delete.
            rows0 = int(sql(url, "SELECT COUNT(*) FROM chunks WHERE refcount = 0")[0][0])
            proc = b.spawn("gc", "--wait", "--json", "-q")
            time.sleep(rng.uniform(0.0, 1.5))
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate()
            if proc.returncode == 0:
                report = json.loads(out)
                outcome = "finished before the kill" + (" (deleted something)" if any(
                    v for k, v in report.items() if k.endswith("deleted") and isinstance(v, int)) else "")
            else:
                check(proc.returncode == -signal.SIGKILL, f"{label}: gc failed on its own: {proc.returncode} {err}")
                rows1 = int(sql(url, "SELECT COUNT(*) FROM chunks WHERE refcount = 0")[0][0])
                if rows0 == 0:
                    outcome = "killed, no chunk rows to forget"
                elif rows1 >= rows0:
                    outcome = "killed before forgetting the rows (waiting for the lock or listing)"
                elif unnamed_packs(swift, bucket, url, prefix):
                    outcome = "killed after forgetting the rows, packs not all deleted"
                else:
                    outcome = "killed after its deletions"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        stop.set()
        saver.join()
    figures[f"{label}: kill -9 during gc"] = outcomes
    figures[f"{label}: saves on A meanwhile"] = saved["n"]
    log(f"{label}: {sum(outcomes.values())} gc runs on B killed at random moments: {outcomes}; {saved['n']} saves on A")


def stop_once_staged(host, swift, bucket, path, name):
    """Starts `save path --name name` on `host` and stops it (SIGSTOP) as soon as a new upload of a
    pack holds a part in the bucket: (the stopped process, its upload ids), or (None, None) when the
    save ended first (it is removed again)."""
    before = set(in_progress_uploads(swift, bucket))
    proc = host.spawn("save", str(path), "--name", name, "--json", "-q")
    while proc.poll() is None:
        new = {u for u, n in in_progress_uploads(swift, bucket).items() if n > 0 and u not in before}
        if new:
            proc.send_signal(signal.SIGSTOP)
            return proc, new
        time.sleep(0.02)
    proc.communicate()
    host.run("rm", name)
    return None, None


def phase_stages(a, b, reg, files, swift, bucket):
    """s: a save stages its pack in the bucket (a multipart upload of the pack's key), never on its
    host, so any host's gc can reclaim what a killed save staged, and none touches a live save's."""
    t0 = time.time()
    for name, seed in (("staged-killed", 500), ("staged-live", 501)):
        path = files / f"{name}.slot"
        make_slot(path, seed=seed, cells=10240, n=1024)  # 85 MB: the pack goes up in several parts
        reg.add(name, str(path))
    def staged_save(name):  # a few tries: a save may end before a poll sees its upload
        for _ in range(3):
            proc, ids = stop_once_staged(a, swift, bucket, reg.files[name][0], name)
            if proc:
                return proc, ids
        check(False, f"s: three saves of {name} ended before a part of their pack went up")
        return None, None

    # Killed (SIGKILL) once its upload holds a part: nothing on A, the upload stays until B's gc.
    proc, ids = staged_save("staged-killed")
    if not proc:
        return
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    check("staged-killed" not in {s["name"] for s in a.ls()}, "s: a killed save is listed")
    check(not staged(a), f"s: the killed save left a pack on host A: {staged(a)}")
    check(ids <= set(in_progress_uploads(swift, bucket)), "s: the killed save's upload went before any gc")
    time.sleep(STALE_UPLOAD_WAIT)
    # Up to three gcs, 2 s apart, each logged; one of them must abort it. (With MULTIPART_MAX_AGE + 1.5
    # s, about one CI run in ten needed a second gc: see STALE_UPLOAD_WAIT.)
    aborted, runs = 0, 0
    while runs < 3 and not aborted:
        if runs:
            time.sleep(2.0)
        runs += 1
        p = b.run("gc", "--wait", "--json", "-q")
        if not check(p.returncode == 0, f"s: B gc: exit {p.returncode}: {p.stderr.strip()}"):
            break
        aborted = json.loads(p.stdout)["uploads_aborted"]
        if not aborted:
            log(f"s: B's gc {runs} aborted no upload (listed: {sorted(ids & set(in_progress_uploads(swift, bucket)))})")
    figures["s: gc runs until the killed save's upload was aborted"] = runs
    check(aborted >= 1, f"s: {runs} gc runs on B aborted no upload")
    check(not ids & set(in_progress_uploads(swift, bucket)), "s: B's gc left the killed save's upload")
    del reg.files["staged-killed"]
    # Live, stopped (SIGSTOP) with a stage older than multipart_max_age: B's gc leaves it.
    proc, ids = staged_save("staged-live")
    if not proc:
        return
    time.sleep(STALE_UPLOAD_WAIT)
    p = b.run("gc", "--json", "-q")
    check(p.returncode == 0 and json.loads(p.stdout)["skipped_busy"],
          f"s: B's gc while a save lives: exit {p.returncode}: {p.stdout} {p.stderr.strip()}")
    waiting = b.spawn("gc", "--wait", "--json", "-q")
    time.sleep(1.0)
    check(waiting.poll() is None, "s: B's gc --wait ran while a save held the lock")
    check(ids <= set(in_progress_uploads(swift, bucket)), "s: the live save's upload was aborted")
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate()
    if check(proc.returncode == 0, f"s: the live save, continued: exit {proc.returncode}: {err.strip()}"):
        reg.committed.add("staged-live")
    out, err = waiting.communicate()
    check(waiting.returncode == 0, f"s: B's gc --wait: exit {waiting.returncode}: {err.strip()}")
    check(not ids & set(in_progress_uploads(swift, bucket)), "s: the live save's upload is still incomplete")
    b.clear_cache()
    restore_matches(b, reg, "staged-live", b.dir / "staged.out")
    figures["s: stage phase seconds"] = round(time.time() - t0, 1)
    log(f"s: a killed save's staged upload reclaimed by B's gc; a live one left alone, committed, restored on B")


def phase_encrypted(work, url, endpoint, swift, bucket, files):
    """e: a second store (its own database, its own prefix of the bucket) encrypted at rest: A saves
    with the key (store config key_file + tenant), B restores it byte for byte with the key, a host
    without the key gets the clear error (exit 2) and writes nothing, and every object under the
    prefix, read raw through Swift, holds none of the slot's token bytes."""
    sql(url, "CREATE DATABASE kvsnap_enc")
    enc_url = url.rsplit("/", 1)[0] + "/kvsnap_enc"
    key = work / "fleet.key"
    key.write_text("5" * 64 + "\n")
    os.chmod(key, 0o600)
    blobs = f"s3://{bucket}/{SEALED}?endpoint=" + urllib.parse.quote(endpoint, safe="")
    keyed = {"key_file": str(key), "tenant": "fleet", "multipart_max_age": MULTIPART_MAX_AGE}
    ea, eb, ec = (Host(n, work, enc_url, blobs, keyed) for n in ("EA", "EB", "EC"))
    keyless = Host("EN", work, enc_url, blobs)
    path = files / "sealed.slot"
    make_slot(path, seed=77, cells=512)
    reg = Registry()
    reg.add("sealed", str(path))
    if not reg.save(ea, "sealed"):
        return
    restore_matches(eb, reg, "sealed", eb.dir / "sealed.out")
    out = keyless.dir / "sealed.out"
    p = keyless.run("restore", "sealed", "-o", str(out), "-q")
    check(p.returncode == 2 and "is encrypted (key " in p.stderr and not out.exists(),
          f"e: a host without the key: exit {p.returncode}: {p.stderr.strip()}")
    with open(path, "rb") as f:
        head = f.read(12 + 64)
    tokens = head[12:12 + 64]  # ggsq v3: magic, version, n_token, then the tokens (i32 LE)
    names = swift.keys(bucket, SEALED + "/")
    check(len(names) > 0, "e: nothing under the encrypted store's prefix")
    leaked = [n for n in names if tokens in swift.call("GET", f"{bucket}/{urllib.parse.quote(n)}")]
    check(not leaked, f"e: objects holding the slot's token bytes: {leaked}")
    p = keyless.run("verify", "--all", "--json")
    check(p.returncode == 0 and '"sealed_only": 1' in p.stdout, f"e: keyless verify: {p.returncode} {p.stdout} {p.stderr}")
    log(f"e: encrypted store: saved on EA, restored on EB with the key, refused without it; {len(names)} objects hold no tokens")
    return ea, eb, ec, reg, enc_url


def phase_encrypted_kills(ea, eb, ec, reg, enc_url, files, rng, swift, bucket, save_kills, gc_kills):
    """eb, ec: the kill -9 phases on the encrypted store, fewer rounds, with check_store made with the
    key (verify, doctor, exact refcounts, restores on a third host byte for byte) after the saves'
    kills and, after both hosts' final gc, over everything with the bucket's contents."""
    t0 = time.time()
    hosts = (ea, eb)
    phase_kill_saves(ea, eb, reg, files, rng, save_kills, enc_url, swift, bucket, prefix=SEALED, label="eb",
                     seconds=60, seed=10000)
    check_store("eb", hosts, ec, reg, enc_url)
    phase_kill_gc(ea, eb, reg, files, rng, gc_kills, enc_url, swift, bucket, prefix=SEALED, label="ec",
                  seconds=45, seed=10000)
    for h in hosts:
        p = h.run("gc", "--wait", "--json", "-q")
        check(p.returncode == 0, f"encrypted final gc on {h.name}: {p.stderr.strip()}")
    check_bucket("encrypted final", swift, bucket, enc_url, hosts, prefix=SEALED)
    check_store("encrypted final", hosts, ec, reg, enc_url, everything=True)
    figures["eb+ec: encrypted kill phases seconds"] = round(time.time() - t0, 1)


def main():
    global KV, ENV, URL
    ap = argparse.ArgumentParser()
    ap.add_argument("kvsnap")
    ap.add_argument("work")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--save-kills", type=int, default=12)
    ap.add_argument("--gc-kills", type=int, default=8)
    ap.add_argument("--encrypted-save-kills", type=int, default=4)
    ap.add_argument("--encrypted-gc-kills", type=int, default=2)
    args = ap.parse_args()
    KV = os.path.abspath(args.kvsnap)
    endpoint = os.environ.get("S3_ENDPOINT")
    if not endpoint:
        sys.exit("no S3 bed: run through tests/beds/swift-s3.sh run DIR auto python3 " + sys.argv[0] + " ...")
    work = Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = random.Random(args.seed)
    log(f"seed {args.seed}")
    t_all = time.time()
    pg_dir, URL = start_postgres(Path("/tmp") / f"kvsnap-fleet-pg-{os.getpid()}")
    try:
        ENV = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "KVSNAP_HOME"}
        ENV.update(AWS_ACCESS_KEY_ID=os.environ["S3_ACCESS_KEY"], AWS_SECRET_ACCESS_KEY=os.environ["S3_SECRET_KEY"])
        swift = Swift(endpoint)
        bucket = f"fleet-{args.seed % 1000000}"
        swift.create(bucket)
        blobs = f"s3://{bucket}/{PREFIX}?endpoint=" + urllib.parse.quote(endpoint, safe="")
        a, b, c = (Host(n, work, URL, blobs, {"multipart_max_age": MULTIPART_MAX_AGE}) for n in ("A", "B", "C"))
        files = work / "files"
        files.mkdir()
        reg = Registry()
        hosts = (a, b)
        phase_cross_host(a, b, reg, URL, swift, bucket, files)
        check_store("d", hosts, c, reg, URL)
        phase_concurrency(a, b, reg, files, rng)
        check_store("a", hosts, c, reg, URL)
        phase_kill_saves(a, b, reg, files, rng, args.save_kills, URL, swift, bucket)
        check_store("b", hosts, c, reg, URL)
        phase_kill_gc(a, b, reg, files, rng, args.gc_kills, URL, swift, bucket)
        check_store("c", hosts, c, reg, URL)
        phase_stages(a, b, reg, files, swift, bucket)  # the final check_store covers it
        for h in (a, b):
            p = h.run("gc", "--wait", "--json", "-q")
            check(p.returncode == 0, f"final gc on {h.name}: {p.stderr.strip()}")
        check_bucket("final", swift, bucket, URL, hosts)
        check_store("final", hosts, c, reg, URL, everything=True)
        sealed = phase_encrypted(work, URL, endpoint, swift, bucket, files)
        if sealed:
            phase_encrypted_kills(*sealed, files, rng, swift, bucket, args.encrypted_save_kills,
                                  args.encrypted_gc_kills)
    finally:
        subprocess.run(["bash", str(SRC / "tests/beds/postgres.sh"), "stop", str(pg_dir)])
    figures["seconds"] = round(time.time() - t_all, 1)
    log("figures: " + json.dumps(figures))
    if failures:
        log(f"{len(failures)} checks failed (seed {args.seed}):\n  " + "\n  ".join(failures))
        return 1
    log("every check held")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

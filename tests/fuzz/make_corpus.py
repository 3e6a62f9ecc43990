#!/usr/bin/env python3
"""Writes the fuzz seed corpus (tests/fuzz/corpus/<target>/) and the crash
reproducers of the fixed fuzz findings (tests/fuzz/regressions/<target>/).

  python3 tests/fuzz/make_corpus.py BUILD_DIR   (a normal build: kvsnap, kvsnap-mkmodel)

Seeds are small real files: 3-token prefixes of fixtures/ state files (cut by
`kvsnap restore --tokens`), their token payloads, snapshots and export archives
of those, metadata-only GGUF models, llama-server / servers.json replies
as the code expects them, kvsnap serve's client bodies and child answers, S3 XML replies,
encrypted chunk blobs (sealed here with Python's `cryptography`, an implementation
independent of kvsnap's), SHA-256 lane messages and what users write (store config files, S3 addresses,
sizes, durations, token lists). The regressions are built here byte by byte so that
they can be read and regenerated. Existing files are written over, none deleted: the
mlx_prompt_cache seeds (written by the real mlx-lm) and reproducers committed by hand stay.
Archives and snapshots hold times and UUIDs, so a run rewrites them with other bytes. Files named
by a 40-hex SHA-1 were merged in from fuzzing campaigns: the units that reach coverage edges the
seeds do not (`FUZZER -set_cover_merge=1 -use_counters=0 CORPUS_DIR CAMPAIGN_DIR`).
"""
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ = os.path.join(ROOT, "tests", "fuzz")

# State files to seed from, and the model whose shape fuzz_llama_state's mode byte picks
# (mode 5 + 8 * index in the sorted fixtures/models listing).
STATES = [
    ("v0.5.0/hd64-f16-f16-faon.slot", "tiny-hd64.gguf"),
    ("v0.5.0/hd64-f16-f16-faoff.slot", "tiny-hd64.gguf"),
    ("v0.5.0/hd64-q4_0-q8_0-faon.slot", "tiny-hd64.gguf"),
    ("v0.5.0/iswa-q8_0-q8_0-faon.slot", "tiny-iswa.gguf"),
    ("v0.5.0/mrope-f16-f16-faon.slot", "tiny-mrope.gguf"),
    ("v0.5.0/hybrid-f16-f16-faon.slot", "tiny-hybrid.gguf"),
    ("b8121/hd64-f16-f16-faon.slot", "tiny-hd64.gguf"),
    ("b5640/hd64-f16-f16-faoff.slot", "tiny-hd64.gguf"),
    ("b5640/hd64-f16-f16-faon.session", "tiny-hd64.gguf"),
    ("b3543/hd64n-q8_0-q8_0-faon.slot", "tiny-hd64n.gguf"),
    ("b3166/hd64n-q8_0-q8_0-faon.slot", "tiny-hd64n.gguf"),
]


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def serve_requests(corpus, regressions):
    """kvsnap serve's inputs (src/serve/requests.h): client bodies, the child's answers."""
    d = os.path.join(corpus, "serve_requests")
    bodies = {
        "completion-text.json": {"prompt": "Building a website can be done in 10 simple steps:", "n_predict": 16,
                                 "cache_prompt": True},
        "completion-tokens.json": {"prompt": [1, 15043, 3186, 29991], "n_predict": 4, "id_slot": 1},
        "completions-oai.json": {"model": "tiny", "prompt": "Hello", "max_tokens": 8, "stream": True},
        "chat.json": {"model": "tiny", "messages": [{"role": "system", "content": "You are terse."},
                                                    {"role": "user", "content": "Hi"}], "max_tokens": 8},
        "chat-tools.json": {"messages": [{"role": "user", "content": "Weather in Paris?"}],
                            "tools": [{"type": "function", "function": {"name": "weather", "parameters": {
                                "type": "object", "properties": {"city": {"type": "string"}}}}}],
                            "chat_template_kwargs": {"enable_thinking": False}, "id_slot": 0},
        "requantize.json": {"ctk": "q8_0", "ctv": "q8_0"},
        "requantize-all.json": {"ctk": "q4_0", "ctv": "q8_0", "flash_attn": "auto", "ctx_size": 8192,
                                "dry_run": True},
        "apply-template.json": {"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
        "answer.json": {"content": " Paris", "id_slot": 0, "stop": True, "tokens_cached": 12,
                        "timings": {"prompt_n": 1, "prompt_ms": 3.0, "predicted_n": 2, "predicted_ms": 9.5}},
        "answer-oai.json": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                                         "finish_reason": "stop"}], "object": "chat.completion",
                            "timings": {"prompt_n": 3, "cache_n": 9}},
    }
    for n, body in bodies.items():
        write(os.path.join(d, n), json.dumps(body))
    events = [{"content": " Par", "stop": False, "id_slot": 0}, {"content": "is", "stop": False, "id_slot": 0},
              {"content": "", "stop": True, "id_slot": 0, "timings": {"prompt_n": 2, "predicted_n": 2}}]
    write(os.path.join(d, "answer-stream.sse"), "".join("data: %s\n\n" % json.dumps(e) for e in events))
    write(os.path.join(d, "answer-stream-oai.sse"),
          "data: %s\n\ndata: %s\n\ndata: [DONE]\n\n" % (
              json.dumps({"choices": [{"delta": {"content": "Hi"}, "index": 0}], "object": "chat.completion.chunk"}),
              json.dumps({"choices": [{"delta": {}, "finish_reason": "stop", "index": 0}],
                          "timings": {"prompt_n": 4, "cache_n": 0}})))
    # llama-server's config.ini files (src/serve/llama_config.h), which kvsnap serve reads.
    write(os.path.join(d, "config.ini"),
          "; llama.cpp system-level config\nctv = q4_1\n[*]\nctx-size = 8192 # tokens\ncache-type-k = q8_0\r\n"
          "no-slots = false\n[model-a]\nhf = someone/model:Q4_K_M\n[default]\nfa = on\napi-key = a,\"b,c\"\n")
    write(os.path.join(d, "config-odd.ini"), b"[ * ]\n\t; c\r[\xc3\xa9]\nLLAMA_ARG_N_PARALLEL=3;x\rfa =\n")
    # Nesting that copying or writing the body would have recursed through (the parsers refuse it).
    r = os.path.join(regressions, "serve_requests")
    write(os.path.join(r, "chat-messages-deep.json"), '{"messages": ' + "[" * 20000 + "]" * 20000 + "}")
    write(os.path.join(r, "prompt-deep-extra.json"), '{"prompt": "a", "x": ' + "[" * 20000 + "]" * 20000 + "}")
    write(os.path.join(r, "tokens-huge.json"), '{"prompt": [1, 1e300, -99999999999], "id_slot": 4294967297}')
    write(os.path.join(r, "prompt-n-wrong.sse"), 'data: {"timings": {"prompt_n": -1}}\n\ndata: {"timings": {"prompt_n": 1e300}}\n')


def s3_xml(corpus):
    """The S3 replies src/store/s3_xml.h parses, as Swift's s3api writes them (tests/beds/swift-s3.sh)."""
    d = os.path.join(corpus, "s3_xml")
    head = "<?xml version='1.0' encoding='UTF-8'?>\n"
    ns = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
    contents = ("<Contents><Key>p/chunks/ab/%s</Key><LastModified>2026-11-28T06:57:19.000Z</LastModified>"
                "<ETag>&quot;0cc175b9c0f1b6a831c399e269772661&quot;</ETag><Size>%d</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>")
    docs = {
        "list-page.xml": head + "<ListBucketResult" + ns + "><Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount>"
        "<MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated><NextContinuationToken>cC9jaHVua3M=</NextContinuationToken>"
        + contents % ("ab" * 32, 1) + contents % ("cd" * 32, 5242880) + "</ListBucketResult>",
        "list-last.xml": head + "<ListBucketResult" + ns + "><Name>b</Name><Prefix/><KeyCount>0</KeyCount>"
        "<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>",
        "error.xml": head + "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message>"
        "<Key>x</Key><RequestId>tx3d11ac56a906421784ac5-006b0a7b4f</RequestId></Error>",
        "error-cdata.xml": "<Error><Code>SignatureDoesNotMatch</Code><Message><![CDATA[a <b> &c]]></Message>"
        "<!-- c --></Error>",
        "upload-id.xml": head + "<InitiateMultipartUploadResult" + ns + "><Bucket>b</Bucket><Key>k</Key>"
        "<UploadId>ZDk2YjA1ZTEtNzIzYS00&#x41;</UploadId></InitiateMultipartUploadResult>",
    }
    for n, body in docs.items():
        write(os.path.join(d, n), body)


def user_text(corpus):
    """fuzz_user_text's seeds: a mode byte (0 store config, 1 S3 address, 2 byte size, 3 duration,
    4 token list, 5 llama-server URL), then the text, as docs/store.md and docs/cli.md write them."""
    d = os.path.join(corpus, "user_text")
    configs = {
        "fleet.json": {"catalog": "postgresql://kvsnap@db.internal/kvsnap", "blobs": "s3://kv-cache/team-a",
                       "local_dir": "/var/cache/kvsnap"},
        "caps.json": {"max_bytes": "100G", "tenant_max_bytes": {"ana": "2G", "bob": 1073741824},
                      "cache_max_bytes": 1073741824, "multipart_max_age": "6h", "compact_dead_percent": 25},
        "keyed.json": {"blobs": "s3://kv-cache/team-a?endpoint=http%3A%2F%2F127.0.0.1%3A8080",
                       "key_file": "keys/master.key", "tenant": "ana"},
        "local.json": {"catalog": "cat.sqlite", "blobs": "blobs", "key_command": "pass show kvsnap"},
    }
    for n, c in configs.items():
        write(os.path.join(d, n), b"\x00" + json.dumps(c).encode())
    locations = {
        "s3-endpoint.txt": "s3://kv-cache/team-a?endpoint=http%3A%2F%2F127.0.0.1%3A8080&region=us-east-1",
        "s3-http-creds.txt": "s3+http://ACCESS:SECRET@127.0.0.1:8080/bucket/prefix?region=RegionOne",
        "s3-https.txt": "s3+https://s3.example.com/bucket",
    }
    for n, t in locations.items():
        write(os.path.join(d, n), b"\x01" + t.encode())
    for n, t in {"size-k.txt": "512K", "size-gib.txt": "20GiB", "size-bytes.txt": "1048576"}.items():
        write(os.path.join(d, n), b"\x02" + t.encode())
    for n, t in {"ttl-s.txt": "90s", "ttl-h.txt": "12h", "ttl-w.txt": "2w"}.items():
        write(os.path.join(d, n), b"\x03" + t.encode())
    for n, t in {"tokens-json.txt": "[1, 15043, 3186]\n", "tokens-lines.txt": "1\n15043\n3186\n",
                 "tokens-commas.txt": "1,15043, -2"}.items():
        write(os.path.join(d, n), b"\x04" + t.encode())
    for n, t in {"url-ip.txt": "http://127.0.0.1:8080", "url-v6.txt": "https://[fd00::5]:8443/team/llama/",
                 "url-bare.txt": "localhost:8080"}.items():
        write(os.path.join(d, n), b"\x05" + t.encode())


def run(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def name_of(rel):
    return rel.replace("/", "-")


# --- SHA-256 lanes (src/base/sha256_lanes.h) ------------------------------------------------

def sha256_lanes(corpus):
    """fuzz_sha256_lanes: byte 0 the lane count - 1, byte 1 the piece-size seed, then the
    messages' bytes; sizes around the 55/56/64-byte padding edges and a few blocks long."""
    d = os.path.join(corpus, "sha256_lanes")
    for lanes, seed, n in ((0, 1, 0), (1, 7, 111), (1, 9, 128), (2, 3, 170), (7, 5, 8 * 64 + 56), (7, 200, 9000)):
        write(os.path.join(d, "lanes%d-%d.seed" % (lanes + 1, n)), bytes([lanes, seed]) + bytes((i * 37) & 255 for i in range(n)))


# --- Quantized -> quantized (migrate/exact_requant.h) ----------------------------------------

# fuzz_requant's types, by byte 0 and 1 modulo their count: the quantized rows of
# migrate/type_traits.cc in order, with their block sizes
REQUANT_TYPES = [("q4_0", 18), ("q4_1", 20), ("q5_0", 22), ("q5_1", 24), ("q8_0", 34), ("iq4_nl", 18)]


def requant(corpus):
    """fuzz_requant: byte 0 the source type, byte 1 the target, byte 2 the search (0 none, 1 quick,
    2 full), then 8 source blocks with an ordinary f16 scale (and offset) and varied levels; a few
    with a zero, subnormal, infinite or NaN scale in one block."""
    d = os.path.join(corpus, "requant")
    pairs = [(2, 0), (0, 4), (4, 0), (4, 5), (1, 0), (3, 1), (5, 1), (2, 5), (3, 2), (0, 2),
             (5, 0), (4, 2), (5, 2),  # the integer search's other sources and targets
             (2, 1), (4, 1), (4, 3), (5, 3)]  # and its routes into the offset targets q4_1 and q5_1
    for k, (si, di) in enumerate(pairs):
        name, size = REQUANT_TYPES[si]
        offset = name in ("q4_1", "q5_1")
        for mode in (0, 1, 2):
            row = bytearray()
            for b in range(8):
                scale = 0x2E66
                if k % 3 == 0 and b == 5:
                    scale = (0x0000, 0x0001, 0x7C00, 0x7E00)[(k // 3) % 4]
                blk = bytearray(struct.pack("<H", scale))
                if offset:
                    blk += struct.pack("<H", 0xAE66)
                blk += bytes(((i * 29 + b * 7 + k) * 13) & 255 for i in range(size - len(blk)))
                row += blk
            write(os.path.join(d, "%s-%s-%s.seed" % (name, REQUANT_TYPES[di][0], ("none", "quick", "full")[mode])),
                  bytes([si, di, mode]) + bytes(row))
    # The integer search's exactness test from an offset source, quick, by block b % 4: the offset a
    # whole multiple of the scale (-8 or -16 times it: embeds), one f16 step off that, 2^-23 beside
    # a scale of 1 with levels 4..7 (every value rounds onto its level: left to the float path),
    # an ordinary offset.
    for si, di in [(1, 0), (1, 2), (3, 0), (3, 2)]:
        name, size = REQUANT_TYPES[si]
        half_levels = 8 if name == "q4_1" else 16
        d16 = 0x2E66
        multiple = struct.unpack("<H", struct.pack("<e", -half_levels * struct.unpack("<e", struct.pack("<H", d16))[0]))[0]
        row = bytearray()
        for b in range(8):
            kind = b % 4
            scale, off = (d16, multiple) if kind == 0 else (d16, multiple + 1) if kind == 1 else \
                (0x3C00, 0x0002) if kind == 2 else (d16, 0xAE66)
            blk = bytearray(struct.pack("<HH", scale, off))
            if name == "q5_1":
                blk += bytes(4) if kind == 2 else bytes(((i * 53 + b) * 17) & 255 for i in range(4))
            blk += bytes((4 + (i + b) % 4) | ((4 + (i * 3 + b) % 4) << 4) if kind == 2 else ((i * 29 + b * 7) * 13) & 255
                         for i in range(16))
            row += blk
        write(os.path.join(d, "%s-%s-quick-offsets.seed" % (name, REQUANT_TYPES[di][0])), bytes([si, di, 1]) + bytes(row))


# --- Encrypted chunk blobs (src/base/chunk_cipher.h), sealed here independently ------------

CIPHER_TENANTS = [b"alice", b"bob", b"acme-prod_1.eu@x"]  # fuzz_chunk_cipher's, by a seed's first byte


def chunk_cipher(corpus):
    """Blobs sealed with Python's `cryptography` under fuzz_chunk_cipher's key (bytes 0..31), as
    docs/store.md describes the format; tests/base/chunk_cipher_test.cc opens them, so this is also
    the independent check of the format. Nonces come from the names: the seeds are reproducible."""
    from cryptography.hazmat.primitives import hashes, hmac
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    master = bytes(range(32))

    def mac(key, data):
        h = hmac.HMAC(key, hashes.SHA256())
        h.update(data)
        return h.finalize()

    def derive(label, tenant):
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"kvsnap chunk cipher v1",
                    info=label + b"\0" + tenant).derive(master)

    d = os.path.join(corpus, "chunk_cipher")
    master_id = mac(master, b"kvsnap key id")[:8]
    for t, tenant in enumerate(CIPHER_TENANTS):
        enc, idk = derive(b"kvsnap chunk enc v1", tenant), derive(b"kvsnap chunk id v1", tenant)
        tenant_id = mac(idk, b"kvsnap tenant key id")[:8]
        for n in [0, 1, 100, 4096]:
            plain = bytes((i * 131 + 7) & 0xff for i in range(n))
            chunk_id = mac(idk, plain)
            nonce = hashlib.sha256(b"nonce %d %d" % (t, n)).digest()[:12]
            header = b"KVSE" + bytes([1, 1, 0, 0]) + master_id + tenant_id + nonce + struct.pack("<I", n)
            sealed = AESGCM(enc).encrypt(nonce, plain, header + chunk_id)  # ciphertext || tag
            write(os.path.join(d, "%s.%d.seed" % (tenant.decode(), n)), bytes([t]) + chunk_id + header + sealed)
    # Key material as a key file or command gives it (first byte 0x80: parse_master_key).
    hexkey = master.hex().encode()
    for name, text in [("hex", hexkey + b"\n"), ("hex-crlf", hexkey + b"\r\n"), ("raw", master),
                       ("short", hexkey[:62]), ("bad", hexkey[:17] + b"g" + hexkey[18:])]:
        write(os.path.join(d, "key-%s.seed" % name), b"\x80" + text)


# --- Snapshot byte surgery (docs/format.md) ---------------------------------------

def sections(man):
    """[(tag, header_at, payload_at, length)] of a manifest."""
    out, at = [], 16
    while at < len(man):
        tag, _flags, n = struct.unpack_from("<IIQ", man, at)
        out.append((man[at:at + 4], at, at + 16, n))
        at += 16 + n
    return out


def reseal(man):
    """Recomputes DIGS' digest of the sections before it."""
    man = bytearray(man)
    tag, header_at, payload_at, _ = sections(man)[-1]
    assert tag == b"DIGS"
    man[payload_at + 40:payload_at + 72] = hashlib.sha256(man[:header_at]).digest()
    return bytes(man)


def split_file(snap):
    area_off, area_len, man_off, man_len = struct.unpack_from("<QQQQ", snap, len(snap) - 80)
    return snap[:man_off], snap[man_off:man_off + man_len], snap[man_off + man_len:]


def join_file(head, man, trailer):
    """A standalone file with `man` in place of its manifest and the trailer's length and hash of it updated."""
    trailer = bytearray(trailer)
    struct.pack_into("<Q", trailer, 24, len(man))
    trailer[32:64] = hashlib.sha256(man).digest()
    return head + man + bytes(trailer)


def payload(man, want):
    for tag, _h, p, n in sections(man):
        if tag == want:
            return p, n
    raise KeyError(want)


def rebuild(man, replace):
    """The manifest with some section payloads replaced ({tag: bytes}), resealed."""
    out = bytearray(man[:16])
    for tag, h, p, n in sections(man):
        body = replace.get(tag, man[p:p + n])
        out += man[h:h + 8] + struct.pack("<Q", len(body)) + body
    return reseal(bytes(out))


def layer_out_of_range(man, layer):
    """Fuzz finding 1: a tensor segment's layer field sized per-layer tables."""
    man = bytearray(man)
    p, _ = payload(man, b"SEGS")
    at = p + 32
    while man[at] == 0:  # frame segment
        at += 64
    struct.pack_into("<I", man, at + 12, layer)
    return reseal(bytes(man))


def frame_bytes_wrap(man):
    """Fuzz finding 2: frame_bytes near 2^64 made (frame_bytes + chunk - 1) / chunk wrap to 0 chunks."""
    huge = 2**64 - 1
    p, n = payload(man, b"INFO")
    info = json.loads(man[p:p + n])
    info["provenance"]["file_size"] = huge
    digs_p, _ = payload(man, b"DIGS")
    digs = bytearray(man[digs_p:digs_p + 72])
    struct.pack_into("<Q", digs, 32, huge)
    segs = struct.pack("<IIQQQ", 1 << 20, 0, huge, 0, 1)
    segs += struct.pack("<BBHIIIQQQQIIIi", 0, 0, 0, 0, 0, 0, 0, huge, 0, 0, 0, 0, 0, 0)
    return rebuild(man, {b"INFO": json.dumps(info, separators=(",", ":")).encode(), b"SEGS": segs,
                         b"CHNK": struct.pack("<Q", 0), b"DIGS": bytes(digs)})


def with_labels(man):
    """An encrypted save's INFO carries the sealed name and tags (INFO.labels, docs/format.md); a plain
    manifest with them reaches the same parse (format/snapshot_info.cc), including a non-ASCII name."""
    p, n = payload(man, b"INFO")
    info = json.loads(man[p:p + n])
    info["labels"] = {"name": "caf\u00e9-42", "tags": {"user": "ana", "serve.ns": "t1"}}
    return rebuild(man, {b"INFO": json.dumps(info, separators=(",", ":")).encode()})


# --- Archives -----------------------------------------------------------------------

def tar_of(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    kvsnap = os.path.join(build, "kvsnap")
    mkmodel = os.path.join(build, "kvsnap-mkmodel")
    models = sorted(os.listdir(os.path.join(ROOT, "fixtures", "models")))
    corpus = os.path.join(FUZZ, "corpus")
    regressions = os.path.join(FUZZ, "regressions")
    # Files are written over, never deleted: seeds from the real mlx-lm and reproducers added by hand
    # (committed beside these) stay.
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(regressions, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        store = os.path.join(tmp, "store")
        # State files: 3-token prefixes, parsed without options and with their model's shape.
        for rel, model in list(STATES):
            src = os.path.join(ROOT, "fixtures", rel)
            name = name_of(rel)
            run(kvsnap, "save", src, "--name", name, "--store", store)
            cut = os.path.join(tmp, name)
            try:
                run(kvsnap, "restore", name, "--tokens", "3", "-o", cut, "--store", store)
            except subprocess.CalledProcessError as e:
                print("skipping %s: %s" % (rel, e.stderr.decode().strip()))
                STATES.remove((rel, model))
                continue
            data = open(cut, "rb").read()
            write(os.path.join(corpus, "llama_state", name), b"\x00" + data)
            write(os.path.join(corpus, "llama_state", name + ".shape"),
                  bytes([5 + 8 * models.index(model)]) + data)
            n_words = struct.unpack_from("<I", data, 8)[0]
            write(os.path.join(corpus, "token_payload", name), data[12:12 + 4 * n_words])
            run(kvsnap, "save", cut, "--name", name + "-3", "--store", store)
            if rel.startswith("v0.5.0/"):
                # A ggsq v3 file is a llama_state_seq_get_data buffer after its token list: mode 1 (raw-seq, era 3).
                write(os.path.join(corpus, "llama_state", name + ".raw"), b"\x01" + data[12 + 4 * n_words:])

        # Snapshots, archives and indexes: exports of the 3-token snapshots.
        small = []
        for rel, _ in STATES[:6]:
            name = name_of(rel) + "-3"
            ex = os.path.join(tmp, name + ".tar.zst")
            run(kvsnap, "export", name, "-o", ex, "--store", store)
            write(os.path.join(corpus, "archive", name + ".tar.zst"), open(ex, "rb").read())
            out = os.path.join(tmp, "x-" + name)
            os.makedirs(out)
            run("tar", "--zstd", "-xf", ex, "-C", out)
            index = open(os.path.join(out, "kvsnap-export.json"), "rb").read()
            write(os.path.join(corpus, "export_index", name + ".json"), index)
            snap_dir = os.path.join(out, "snapshots")
            snap = open(os.path.join(snap_dir, os.listdir(snap_dir)[0]), "rb").read()
            write(os.path.join(corpus, "snapshot", name + ".kvsnap"), snap)
            write(os.path.join(corpus, "snapshot", name + ".manifest"), split_file(snap)[1])
            small.append((name, index, snap))
        head, man, trailer = split_file(small[0][2])
        labelled = with_labels(man)
        write(os.path.join(corpus, "snapshot", "labels.manifest"), labelled)
        write(os.path.join(corpus, "snapshot", "labels.kvsnap"), join_file(head, labelled, trailer))
        # mlx-lm prompt caches (manifests with MLXC, format/snapshot_mlx.h): the mlx-lm files of the
        # mlx_prompt_cache corpus (made by the real mlx-lm), saved and exported.
        mlx_dir = os.path.join(corpus, "mlx_prompt_cache")
        for src in sorted(os.listdir(mlx_dir)):
            name = "mlx-" + src[: -len(".safetensors")]
            run(kvsnap, "save", os.path.join(mlx_dir, src), "--name", name, "--tokens", "1,2,3", "--store", store)
            ex = os.path.join(tmp, name + ".tar.zst")
            run(kvsnap, "export", name, "-o", ex, "--store", store)
            out = os.path.join(tmp, "x-" + name)
            os.makedirs(out)
            run("tar", "--zstd", "-xf", ex, "-C", out)
            snap_dir = os.path.join(out, "snapshots")
            snap = open(os.path.join(snap_dir, os.listdir(snap_dir)[0]), "rb").read()
            write(os.path.join(corpus, "snapshot", name + ".kvsnap"), snap)
            write(os.path.join(corpus, "snapshot", name + ".manifest"), split_file(snap)[1])
        # Layouts that cannot be cut to a prefix (iSWA, hybrid): released snapshots and a whole small state.
        for rel in ["kvsnap/v1/b8121-hybrid-f16-f16-faon.kvsnap", "kvsnap/v1/v0.5.0-iswa-q8_0-q8_0-faon.kvsnap"]:
            write(os.path.join(corpus, "snapshot", os.path.basename(rel)), open(os.path.join(ROOT, "fixtures", rel), "rb").read())
        hybrid = open(os.path.join(ROOT, "fixtures/v0.5.0/hybrid-f16-f16-faon.slot"), "rb").read()
        write(os.path.join(corpus, "llama_state", "v0.5.0-hybrid-f16-f16-faon.slot.shape"),
              bytes([5 + 8 * models.index("tiny-hybrid.gguf")]) + hybrid)
        # A ggsn v8 session (b3543: RNG text, outputs) cannot be cut to a prefix either: the whole small one.
        v8 = open(os.path.join(ROOT, "fixtures/b3543/hd64n-q8_0-q8_0-faon.session"), "rb").read()
        write(os.path.join(corpus, "llama_state", "b3543-hd64n-q8_0-q8_0-faon.session.shape"),
              bytes([5 + 8 * models.index("tiny-hd64n.gguf")]) + v8)
        # A ggsn v6 session (b3166: raw llama_hparams, legacy KV dump) is read only with the model.
        v6 = open(os.path.join(ROOT, "fixtures/b3166/hd64n-q8_0-q8_0-faon.session"), "rb").read()
        write(os.path.join(corpus, "llama_state", "b3166-hd64n-q8_0-q8_0-faon.session.shape"),
              bytes([5 + 8 * models.index("tiny-hd64n.gguf")]) + v6)
        name, index, snap = small[0]
        write(os.path.join(corpus, "archive", name + ".tar"),
              tar_of([("kvsnap-export.json", index), ("snapshots/a.kvsnap", snap)]))

        # GGUF: metadata-only models of every arch kvsnap models.
        for arch in ["llama", "gemma2", "gemma3", "qwen2vl", "lfm2", "deci"]:
            out = os.path.join(corpus, "gguf", arch + ".gguf")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            try:
                run(mkmodel, "--out", out, "--arch", arch, "--n-layer", "4", "--n-embd", "256", "--metadata-only")
            except subprocess.CalledProcessError as e:
                print("skipping gguf %s: %s" % (arch, e.stderr.decode().strip()))

        # llama-server replies, as llama-server v0.5.0 sends them.
        replies = {
            "slots.json": [{"id": 0, "n_ctx": 4096, "is_processing": False, "params": {"n_predict": -1}},
                           {"id": 1, "n_ctx": 4096, "is_processing": True}],
            "save.json": {"id_slot": 0, "filename": "s.bin", "n_saved": 12, "n_written": 20480,
                          "timings": {"save_ms": 1.5}},
            "restore.json": {"id_slot": 0, "filename": "s.bin", "n_restored": 12, "n_read": 20480,
                             "timings": {"restore_ms": 2.25}},
            "tokenize.json": {"tokens": [1, 15043, 3186]},
            "tokenize-pieces.json": {"tokens": [{"id": 1, "piece": "<s>"}, {"id": 15043, "piece": " Hello"}]},
            "completion.json": {"content": "", "id_slot": 0, "stop": True,
                                "timings": {"prompt_n": 1, "cache_n": 11, "prompt_ms": 3.0}},
            "error.json": {"error": {"code": 400, "message": "failed to restore slot", "type": "invalid_request_error"}},
            "error-string.json": {"error": "Loading model"},
        }
        for n, body in replies.items():
            write(os.path.join(corpus, "server_replies", n), json.dumps(body))
        serve_requests(corpus, regressions)
        s3_xml(corpus)
        chunk_cipher(corpus)
        sha256_lanes(corpus)
        requant(corpus)
        user_text(corpus)
        profiles = {"version": 1, "servers": [
            {"name": "local", "url": "http://127.0.0.1:8080", "slot_dir": "/srv/slots", "ctk": "q8_0",
             "ctv": "q8_0", "flash_attn": "on", "model": "/m/tiny.gguf", "api_key_file": ""},
            {"name": "bare", "url": "http://h:1", "slot_dir": "/s"}]}
        write(os.path.join(corpus, "server_profiles", "servers.json"), json.dumps(profiles, indent=2))

        # --- Regressions: the inputs of the fixed findings --------------------------------
        name, index, snap = small[0]
        head, man, trailer = split_file(snap)
        for layer in (0x40000000, 0xFFFFFFFF):
            bad = layer_out_of_range(man, layer)
            write(os.path.join(regressions, "snapshot", "layer-%08x.manifest" % layer), bad)
            write(os.path.join(regressions, "snapshot", "layer-%08x.kvsnap" % layer), join_file(head, bad, trailer))
        write(os.path.join(regressions, "snapshot", "frame-bytes-wrap.manifest"), frame_bytes_wrap(man))
        mistyped = b'{"snapshots": [{"file": "snapshots/a.kvsnap", "uuid": 12345}]}'
        missing = b'{"snapshots": [{"file": "snapshots/a.kvsnap"}], "kvsnap_export": 1}'
        write(os.path.join(regressions, "archive", "uuid-number.tar"),
              tar_of([("kvsnap-export.json", mistyped), ("snapshots/a.kvsnap", snap)]))
        write(os.path.join(regressions, "archive", "no-name-no-tags.tar"),
              tar_of([("kvsnap-export.json", missing), ("snapshots/a.kvsnap", snap)]))
        write(os.path.join(regressions, "export_index", "uuid-number.json"), mistyped)
        write(os.path.join(regressions, "export_index", "no-name-no-tags.json"), missing)
        write(os.path.join(regressions, "export_index", "entry-not-object.json"), b'{"snapshots": [7, null]}')
        write(os.path.join(regressions, "export_index", "name-array.json"),
              b'{"snapshots": [{"file": "a", "name": ["x"], "tags": {"k": 1}}]}')
        for n, body in {"slots-id-string.json": '[{"id": "0", "n_ctx": 1e300}]',
                        "slots-not-objects.json": '[1, "a", null]',
                        "tokenize-huge.json": '{"tokens": [1e300, -99999999999, "x"]}',
                        "timings-not-object.json": '{"timings": 5, "n_saved": -1, "content": 3}',
                        "error-nested.json": '{"error": {"type": 1, "message": [2]}}'}.items():
            write(os.path.join(regressions, "server_replies", n), body)
        # parse_s3_location kept the '/' of "BUCKET//PREFIX" in front of the prefix
        write(os.path.join(regressions, "user_text", "prefix-leading-slash.txt"), b"\x01s3+http://a:b@h/bucket//team-a")
        write(os.path.join(regressions, "server_profiles", "name-number.json"),
              b'{"servers": [{"name": 5, "url": null}, 3]}')
    finally:
        shutil.rmtree(tmp)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(corpus) for f in fs)
    print("corpus: %d bytes" % total)


if __name__ == "__main__":
    main()

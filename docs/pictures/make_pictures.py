#!/usr/bin/env python3
"""The pictures of the docs, drawn from the project's own measurements.

    python3 docs/pictures/make_pictures.py                 # redraw every PNG from the data below
    python3 docs/pictures/make_pictures.py --fidelity-dir build/tests/oracle/fidelity
                                                           # first take a new fidelity run's results

Sources (each picture records the SHA-256 of the exact text it was drawn from in its PNG metadata,
key "kvsnap-source-sha256"; docs/pictures/check_pictures.py, ctest docs.pictures_current, fails when a
source changed and the picture was not redrawn):
  fidelity.png          docs/pictures/data/fidelity-{results,natives}.txt, copied from a run of
                        tests/oracle/fidelity_test.sh (ctest -L fidelity: <build>/tests/oracle/fidelity)
  conversion-speed.png  the per-level table of docs/performance.md ("Current figures")
  store-speed.png       the kvsnap-store-bench table of docs/store.md ("Speed and space")
  resume.png            the live-requantization table of docs/capi.md

Needs matplotlib (a venv outside the checkout: python3 -m venv ~/.cache/kvsnap-pictures-venv &&
~/.cache/kvsnap-pictures-venv/bin/pip install matplotlib); reading the sources does not.
"""
import argparse
import hashlib
import math
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data")
KEY = "kvsnap-source-sha256"


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def table_after(doc, heading_re, must_contain):
    """The first markdown table after the heading matching heading_re whose header has must_contain:
    (its text, its rows as lists of cells)."""
    text = read(os.path.join(DOCS, doc))
    m = re.search(heading_re, text, re.M)
    if not m:
        raise SystemExit(f"{doc}: no heading matching {heading_re!r}")
    lines = text[m.end():].splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and must_contain in lines[i]:
            while i > 0 and lines[i - 1].startswith("|"):
                i -= 1  # the table starts at its header
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            block = lines[i:j]
            rows = [[c.strip() for c in l.strip().strip("|").split("|")] for l in block if not re.match(r"^\|[\s:|-]+\|$", l)]
            return "\n".join(block), rows
        i += 1
    raise SystemExit(f"{doc}: no table with {must_contain!r} after {heading_re!r}")


def number(cell):
    m = re.search(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?", cell.replace("**", ""))
    return float(m.group(0).replace(",", "")) if m else float("nan")


# --- the sources ------------------------------------------------------------------------------

def fidelity_source():
    text = read(os.path.join(DATA, "fidelity-results.txt")) + read(os.path.join(DATA, "fidelity-natives.txt"))
    return text


def conversion_source():
    return table_after("performance.md", r"^## Current figures", "conversion")


def store_source():
    return table_after("store.md", r"^## Speed and space", "plain copy")


def resume_source():
    return table_after("capi.md", r"^Measured", "time")


def sources():
    """picture -> the text it is drawn from (what its recorded hash covers)."""
    return {
        "fidelity.png": fidelity_source(),
        "conversion-speed.png": conversion_source()[0],
        "store-speed.png": store_source()[0],
        "resume.png": resume_source()[0],
    }


# --- the drawings -----------------------------------------------------------------------------

def draw_fidelity(plt, colors):
    natives = {}
    for line in read(os.path.join(DATA, "fidelity-natives.txt")).splitlines():
        f = line.split()
        if len(f) == 5:
            natives[(f[0], f[1], f[2], f[3])] = float(f[4])  # model fa config ref_fa -> KL
    cells = {}
    order = []
    for line in read(os.path.join(DATA, "fidelity-results.txt")).splitlines():
        f = line.split()
        if len(f) < 7 or f[1] != f[2]:
            continue  # same fa setting on both sides only: the square matrices
        m, fa, s, t, status, kl = f[0], f[1], f[3], f[4], f[5], f[6]
        for c in (s, t):
            if c not in order:
                order.append(c)
        ns, nt = natives.get((m, fa, s, fa), math.nan), natives.get((m, fa, t, fa), math.nan)
        den = max(ns, nt)
        try:
            k = float(kl)
        except ValueError:
            k = math.nan
        if status != "ok" or math.isnan(k):
            ratio = math.nan
        elif k <= 1e-6 or den <= 0:
            ratio = 0.0
        else:
            ratio = k / den
        cells[(m, fa, s, t)] = ratio
    panels = sorted({(m, fa) for (m, fa, _, _) in cells}, key=lambda p: (p[0], p[1] != "on"))
    ncol = 2
    nrow = (len(panels) + 1) // 2
    fig, axes = plt.subplots(nrow, ncol, figsize=(13, 6.2 * nrow), squeeze=False, layout="constrained")
    cmap = plt.get_cmap("RdYlGn_r")
    norm = colors.Normalize(vmin=0, vmax=2.0)
    for ax, (m, fa) in zip(axes.flat, panels):
        cfgs = [c for c in order if any((m, fa, c, t) in cells for t in order)]
        grid = [[cells.get((m, fa, s, t), math.nan) for t in cfgs] for s in cfgs]
        im = ax.imshow(grid, cmap=cmap, norm=norm)
        ax.set_xticks(range(len(cfgs)), cfgs, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(cfgs)), cfgs, fontsize=7)
        ax.set_xlabel("target (K/V)")
        ax.set_ylabel("source (K/V)")
        ax.set_title(f"{m.replace('tiny-', '').replace('.gguf', '')}, flash attention {fa}")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, "-" if v == 0 else f"{v:.1f}", ha="center", va="center", fontsize=5.5)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.6, label="KL converted / max(KL native source, KL native target)")
    fig.suptitle("Fidelity: every conversion restored in llama.cpp v0.5.0, same flash-attention setting on both sides\n"
                 "cell = KL / max(native KLs); pass: <= 1.5, or the lateral rule (docs/fidelity.md); - : all KLs 0",
                 fontsize=11)
    return fig


def draw_conversion(plt):
    _, rows = conversion_source()
    head, body = [h.lower() for h in rows[0]], rows[1:]
    levels = [h.split(" / ")[0] for h in head if h.endswith("/ ggml cpu")]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / max(1, len(levels))
    for k, lv in enumerate(levels):
        col = head.index(f"{lv} / ggml cpu")
        vals = [number(r[col]) for r in body]
        ax.bar([i + (k - (len(levels) - 1) / 2) * width for i in range(len(body))], vals, width=width, label=lv)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.text(len(body) - 0.5, 1.03, "ggml's own CPU routine (same SIMD level)", ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(body)), [r[0] + ("\n" + r[1] if r[1] != "none" else "") for r in body], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("kvsnap speed / ggml's CPU speed (1 thread)")
    ax.legend(title="kvsnap SIMD level")
    ax.set_title("Conversion speed per type and SIMD level, beside ggml (docs/performance.md)")
    fig.tight_layout()
    return fig


def draw_store(plt):
    _, rows = store_source()
    labels, vals = [], []
    for r in rows[1:]:
        v = number(r[1])
        if "GB/s" in r[1] and not math.isnan(v):
            labels.append(re.sub(r"\s*\(.*", "", r[0]).replace("`", ""))
            vals.append(v)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(labels[::-1], vals[::-1], color=["#888" if "copy" in l else "#3a7" for l in labels[::-1]])
    for i, v in enumerate(vals[::-1]):
        ax.text(v, i, f" {v:.2f}", va="center")
    ax.set_xlabel("GB/s (f16 slot, 2 threads)")
    ax.set_title("The store beside a plain copy + fsync (docs/store.md)")
    fig.tight_layout()
    return fig


def draw_resume(plt):
    _, rows = resume_source()
    labels, ms, ratio = [], [], ""
    for r in rows[1:]:
        if "ms" in r[1]:
            labels.append(re.sub(r"\s*\(.*?\)", "", r[0]))
            ms.append(number(r[1]))
        elif r[0].strip().lower() == "ratio":
            ratio = r[1].replace("*", "")
    fig, ax = plt.subplots(figsize=(10, 2.8))
    ax.barh(labels[::-1], ms[::-1], color=["#3a7", "#c44"][: len(ms)][::-1])
    for i, v in enumerate(ms[::-1]):
        ax.text(v, i, f" {v:,.0f} ms", va="center")
    ax.set_title(f"Requantizing a live session vs reprocessing its prompt: {ratio} faster (docs/capi.md)")
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds (log)")
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fidelity-dir", help="take results.txt and natives.txt of this fidelity run first")
    args = ap.parse_args()
    if args.fidelity_dir:
        os.makedirs(DATA, exist_ok=True)
        for name in ("results", "natives"):
            shutil.copyfile(os.path.join(args.fidelity_dir, f"{name}.txt"), os.path.join(DATA, f"fidelity-{name}.txt"))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.colors as colors
    import matplotlib.pyplot as plt
    src = sources()
    figs = {
        "fidelity.png": lambda: draw_fidelity(plt, colors),
        "conversion-speed.png": lambda: draw_conversion(plt),
        "store-speed.png": lambda: draw_store(plt),
        "resume.png": lambda: draw_resume(plt),
    }
    for name, make in figs.items():
        fig = make()
        fig.savefig(os.path.join(HERE, name), dpi=110, metadata={KEY: sha(src[name]), "Software": None})
        plt.close(fig)
        print(f"wrote docs/pictures/{name}")


if __name__ == "__main__":
    sys.exit(main())

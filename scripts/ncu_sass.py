#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's per-SASS-instruction table: the output of
`ncu --section SourceCounters --page source --print-source sass --csv ...` (plain or .gz; the
lines ncu prints before the table are skipped). Prints the samples by stall reason, the samples in
runs of N instructions (with the kinds of instruction in each run: HGMMA, SYNCS (mbarrier waits),
BAR, LDG/STG, MUFU.EX2, ...: enough to tell prologue, loop and epilogue apart), and the top
instructions. How session 7 found flash_wg's Q staging and epilogue (docs/kernels.md, Attention).
Reads one file; writes nothing.
usage: scripts/ncu_sass.py FILE [RUN_LENGTH (100)] [TOP (30)]"""
import csv, gzip, io, sys

MARKS = ("HGMMA", "SYNCS", "BAR.", "LDG", "STG", "LDS", "STS", "MUFU.EX2", "SHFL", "USETMAXREG", "UTMALDG", "F2FP", "EXIT")


def rows_of(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"Address","Source"')), None)
    if start is None:
        sys.exit(f"{path}: no '\"Address\",\"Source\"' table (was ncu run with --page source --csv?)")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    return rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.splitlines()[-1])
    hdr, rows = rows_of(sys.argv[1])
    run = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    S, E = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
    reasons = [(h[6:], i) for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    n = lambda r, i: int(r[i].replace(",", "") or 0)
    total = sum(n(r, S) for r in rows) or 1
    by = sorted(((sum(n(r, i) for r in rows), name) for name, i in reasons), reverse=True)
    print(f"{len(rows)} instructions, {total} samples; by reason: " + ", ".join(f"{k} {v}" for v, k in by[:8] if v))
    for b in range(0, len(rows), run):
        seg = rows[b:b + run]
        s = sum(n(r, S) for r in seg)
        kinds = sorted({m for r in seg for m in MARKS if m in r[1]})
        print(f"{b:5d}-{b + len(seg) - 1:5d} {s:6d} {100 * s / total:5.1f}%  exec<={max(n(r, E) for r in seg):8d}  {' '.join(kinds)}")
    print(f"top {top}:")
    for i in sorted(sorted(range(len(rows)), key=lambda i: -n(rows[i], S))[:top]):
        r = rows[i]
        why = ", ".join(f"{k} {v}" for v, k in sorted(((n(r, j), k) for k, j in reasons), reverse=True)[:2] if v)
        print(f"{i:5d} {n(r, S):6d} {100 * n(r, S) / total:5.1f}%  {r[1].strip()[:72]:72s} {why}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The summary tables of scripts/device-serve.sh steps, from the logs in $OUT_DIR: decode ms per
layer-step per case and variant (both rounds) against the floor (weights + KV bytes over the copy
bandwidth PyTorch measured in the same run) and PyTorch's graph; the mixed step; then each ncu log's
last step, kernel by kernel (time, DRAM bytes, achieved GB/s). Reads logs only; never fails on a
missing or broken one (prints '-')."""
import csv, json, os, re

out = os.environ.get("OUT_DIR", ".")
variants = os.environ.get("VARIANTS_L", "base").split()
cases = os.environ.get("CASES_L", "").split()
shape = {"s16": (16, 1024), "s64": (64, 1024), "s256": (256, 1024), "s64k4": (64, 4096), "s64rag": (64, 1024)}


def read(name):
    try:
        with open(os.path.join(out, name + ".log"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def bench_json(name):
    for line in read(name).splitlines():
        if line.startswith("{") and '"mode":"serve"' in line:
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


torch, copy_bw = {}, None
for line in read("torch_serve").splitlines():
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j.get("torch") == "copy":
        copy_bw = j["gb_per_s"]
    elif "seqs" in j and j.get("mode") == "eager+cudagraph":
        torch[(j["seqs"], j["ctx"])] = j["ms_per_layer"]
bw = copy_bw or 3000.0
print(f"== decode, ms per layer-step (round 1 / round 2), llama-7b f16, paged f16 pool block 16; floor = bytes / "
      f"{bw:.0f} GB/s ({'PyTorch copy, same run' if copy_bw else 'assumed: no PyTorch copy'})")
print(f"{'case':<8} {'floor':>7} {'torch':>7}" + "".join(f" {v:>21}" for v in variants))
for c in cases:
    n, ctx = shape.get(c, (0, 0))
    row, floor = "", None
    for v in variants:
        r = [bench_json(f"r{i}_{c}_{v}") for i in (1, 2)]
        ms = [j["decode_ms_per_layer"] for j in r if j and j.get("decode_ms_per_layer")]
        if r[0] and floor is None:
            floor = r[0]["decode_bytes_per_layer"] / (bw * 1e9) * 1e3
        cell = "/".join(f"{m:.3f}" for m in ms) or "-"
        if ms and floor:
            cell += f" {100 * floor / min(ms):3.0f}%"
        row += f" {cell:>21}"
    t = torch.get((n, ctx)) if c != "s64rag" else None
    print(f"{c:<8} {floor or 0:7.3f} {t if t else '-':>7}" + row)
print("(percent: floor / best round; torch: eager ops in one CUDA graph over contiguous caches)")

print("\n== mixed step (512-token chunk + 63 decoding), ms per layer: step, profiled matmul / attention / all kernels")
for v in variants:
    for i in (1, 2):
        j = bench_json(f"r{i}_s64_{v}")
        if j and j.get("mixed_ms_per_layer"):
            print(f"{v:<8} r{i}: {j['mixed_ms_per_layer']:.3f}  matmul {j['mixed_matmul_ms_per_layer']:.3f}  attention "
                  f"{j['mixed_attention_ms_per_layer']:.3f}  of {j['mixed_profiled_ms_per_layer']:.3f}")


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def ncu_kernels(text):
    """[(id, name, grid, {metric: value})] in launch order, from ncu --csv --print-units base output."""
    rows = [l for l in text.splitlines() if l.startswith('"')]
    if not rows:
        return []
    rd = csv.reader(rows)
    head = next(rd)
    try:
        ii, ni, gi, mi, vi = (head.index(h) for h in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Value"))
    except ValueError:
        return []
    ks = {}
    for r in rd:
        if len(r) <= max(ii, ni, gi, mi, vi) or r[ii] == "ID":
            continue
        k = ks.setdefault(int(r[ii]), (r[ni], r[gi].replace(" ", ""), {}))
        k[2][r[mi]] = num(r[vi])
    return [(i,) + ks[i] for i in sorted(ks)]


for f in sorted(os.listdir(out)):
    m = re.match(r"ncu_(s\w+?)_(\w+)\.log$", f)
    if not m:
        continue
    ks = ncu_kernels(read(f[:-4]))
    steps = 5 if "mixed" in m.group(1) else 2
    last = ks[len(ks) - len(ks) // steps:] if ks else []
    print(f"\n== ncu {m.group(1)} {m.group(2)}: the last step's {len(last)} kernels (of {len(ks)}), one layer")
    if not last:
        print("   (no kernels parsed)")
        continue
    print(f"   {'kernel':<22} {'grid':>14} {'blk':>4} {'regs':>4} {'us':>8} {'MB rd':>8} {'MB wr':>7} {'GB/s':>6}")
    tot_t = tot_b = 0.0
    for _, name, grid, mv in last:
        t = (mv.get("gpu__time_duration.sum") or 0) * 1e-3
        rd, wr = mv.get("dram__bytes_read.sum") or 0, mv.get("dram__bytes_write.sum") or 0
        tot_t, tot_b = tot_t + t, tot_b + rd + wr
        gbs = (rd + wr) / (t * 1e-6) * 1e-9 if t else 0
        print(f"   {name[:22]:<22} {grid[:14]:>14} {mv.get('launch__block_size') or 0:4.0f} "
              f"{mv.get('launch__registers_per_thread') or 0:4.0f} {t:8.1f} {rd * 1e-6:8.1f} {wr * 1e-6:7.1f} {gbs:6.0f}")
    print(f"   {'sum':<22} {'':>14} {'':>4} {'':>4} {tot_t:8.1f} {'':>8} {'':>7} {tot_b / (tot_t * 1e-6) * 1e-9 if tot_t else 0:6.0f}")

for f in sorted(os.listdir(out)):
    if not f.startswith("ncu_why_"):
        continue
    print(f"\n== {f[:-4]}: speed of light, memory, stalls, occupancy (counts of equal lines)")
    keep = re.compile(r"Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Achieved Occupancy|Theoretical Occupancy|"
                      r"Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|Waves Per SM|Grid Size|"
                      r"Mem Busy|Max Bandwidth|Shared Memory Configuration Size|Dynamic Shared")
    seen = {}
    for line in read(f[:-4]).splitlines():
        if keep.search(line):
            s = " ".join(line.split())
            seen[s] = seen.get(s, 0) + 1
    for s, cnt in list(seen.items())[:40]:
        print(f"   {cnt:2d}x {s}")

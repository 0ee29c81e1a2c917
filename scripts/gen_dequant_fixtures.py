#!/usr/bin/env python3
"""Writes tests/data/ggml_quant_fixtures.txt: for every GGUF block format kiln runs (the i-quants too), the FNV-1a 64
hash of what the `gguf` package's numpy code (llama.cpp's gguf-py, which follows ggml's C) gives for
block bytes and floats that tests/test_quant_fixtures.c regenerates with the same splitmix64
stream. Lines: `dequant NAME N_BLOCKS HASH` (f32 output of random blocks) and `quant NAME N_BLOCKS
HASH` (block bytes from random floats, for formats gguf-py quantizes as ggml's reference does).
Run it after changing the generators; CI only reads the file (no network, no numpy)."""
import sys
import numpy as np
from gguf import GGMLQuantizationType as T, quants

M = (1 << 64) - 1
FORMATS = [  # name, ggml type, f16 fields (byte offsets) to make sane
    ("q8_0", T.Q8_0, [0]), ("q4_k", T.Q4_K, [0, 2]), ("q5_k", T.Q5_K, [0, 2]), ("q6_k", T.Q6_K, [208]),
    ("q4_0", T.Q4_0, [0]), ("q4_1", T.Q4_1, [0, 2]), ("q5_0", T.Q5_0, [0]), ("q5_1", T.Q5_1, [0, 2]),
    ("iq4_nl", T.IQ4_NL, [0]), ("q2_k", T.Q2_K, [80, 82]), ("q3_k", T.Q3_K, [108]), ("iq4_xs", T.IQ4_XS, [0]),
]
# The i-quants (dequantization only): the f16 scale at byte 0, except iq1_m's, whose four nibbles sit
# in the top nibbles of its four u16 scale words (bytes 49, 51, 53, 55): "spread".
IQ_FORMATS = [
    ("iq2_xxs", T.IQ2_XXS, [0]), ("iq2_xs", T.IQ2_XS, [0]), ("iq2_s", T.IQ2_S, [0]), ("iq3_xxs", T.IQ3_XXS, [0]),
    ("iq3_s", T.IQ3_S, [0]), ("iq1_s", T.IQ1_S, [0]), ("iq1_m", T.IQ1_M, "spread"),
]
QUANT = [("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q5_0", T.Q5_0), ("q5_1", T.Q5_1)]
SEED = 0x6b696c6e  # "kiln"


class Rng:
    def __init__(self, seed):
        self.s = seed

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)


def fnv(b):
    h = 0xCBF29CE484222325
    for x in bytes(b):
        h = ((h ^ x) * 0x100000001B3) & M
    return h


def f16_bits(r, blk):
    """A sane f16 scale: block 0 zero, block 1 subnormal, else +-2^(-10..1) with a random mantissa."""
    z = r.next()
    if blk == 0:
        return 0
    if blk == 1:
        return (z & 0x3FF) | 1 | (0x8000 if z & 0x400 else 0)
    e = 5 + (z >> 11) % 12
    return (z & 0x3FF) | (e << 10) | (0x8000 if (z >> 20) & 1 else 0)


def blocks(r, qtype, f16s, n):
    bs, ts = quants.GGML_QUANT_SIZES[qtype]
    out = bytearray()
    for b in range(n):
        blk = bytearray()
        while len(blk) < ts:
            blk += r.next().to_bytes(8, "little")
        blk = blk[:ts]
        if f16s == "spread":
            h = f16_bits(r, b)
            for k in range(4):
                blk[49 + 2 * k] = (blk[49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)
        for off in (f16s if f16s != "spread" else []):
            blk[off:off + 2] = f16_bits(r, b).to_bytes(2, "little")
        out += blk
    return np.frombuffer(bytes(out), dtype=np.uint8)


def floats(r, n):
    mult = [1.0, 0.01, 100.0, 3.0, 1e-4, 0.5]
    off = [0.0, 0.0, 0.0, 2.5, 0.0, -0.75]
    x = np.empty(n, dtype=np.float64)
    for i in range(n):
        blk = i // 32
        u = (r.next() >> 40) * 2.0**-23 - 1.0
        x[i] = u * mult[blk % 6] + off[blk % 6]
    return x.astype(np.float32)


def main():
    out = []
    for name, qtype, f16s in FORMATS + IQ_FORMATS:
        bs, ts = quants.GGML_QUANT_SIZES[qtype]
        n = 64 if bs == 32 else 16
        r = Rng(SEED + int(qtype))
        raw = blocks(r, qtype, f16s, n)
        y = quants.dequantize(raw, qtype).astype(np.float32)
        out.append(f"dequant {name} {n} {fnv(y.tobytes()):016x}")
    for name, qtype in QUANT:
        r = Rng(SEED + 1000 + int(qtype))
        x = floats(r, 64 * 32)
        q = quants.quantize(x.reshape(64, 32), qtype)
        out.append(f"quant {name} 64 {fnv(q.tobytes()):016x}")
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/ggml_quant_fixtures.txt"
    from importlib.metadata import version
    with open(path, "w") as f:
        f.write(f"# written by scripts/gen_dequant_fixtures.py (gguf {version('gguf')}, numpy {np.__version__})\n")
        f.write("\n".join(out) + "\n")

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes crates/kernels/tests/fixtures/quant_gguf.bin: raw row bytes and their dequantization by
the Python `gguf` package (gguf-py, version 0.19.0), the independent reference for tandem's
row formats (`tandem_kernels::quant`).

For F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 the rows come from
`gguf.quants.quantize` on seeded random f32 input (recorded too, so the Rust test can also
check quantization bit-exactly). For Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and
IQ4_XS the script also builds random valid blocks (finite f16 scales, every other byte
random, so every bit of every scale and quant field is exercised) and records gguf's
dequantization.

File layout (little-endian):
    b"TQFX", u32 version (=1), u32 record count, then per record:
    u32 ggml type id, u32 n_elements, u32 has_input (0/1), u32 n_bytes,
    [f32 x n_elements input, if has_input], u8 x n_bytes row, f32 x n_elements dequantized.

Run from the repository root: python3 scripts/make_quant_fixtures.py
"""

import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

SEED = 20240601
OUT = Path(__file__).resolve().parent.parent / "crates/kernels/tests/fixtures/quant_gguf.bin"


def float_input(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random values with a different magnitude per 32-element block, plus edge cases."""
    x = rng.standard_normal(n).astype(np.float32)
    scales = np.float32(10.0) ** rng.uniform(-3, 2, size=n // 32).astype(np.float32)
    x *= np.repeat(scales, 32)
    x[:32] = 0.0  # an all-zero block (d = 0 paths)
    x[32] = -np.abs(x[33:64]).max() * 1.5  # a negative extreme (Q4_0 sign of d, clipping)
    return x.astype(np.float32)


def bf16_input(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(64).astype(np.float32)
    # Exact ties: rounds down to even, rounds up to even; a large value; a NaN.
    special = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x7FC00001], dtype=np.uint32)
    x[:4] = special.view(np.float32)
    return x


# Byte offsets of each block's f16 scale `d` and, where there is one, its f16 `dmin` / `m`.
SCALE_OFFSETS = {
    T.Q5_0: (0, None),
    T.Q5_1: (0, 2),
    T.IQ4_NL: (0, None),
    T.Q2_K: (80, 82),
    T.Q3_K: (108, None),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208, None),
    T.IQ4_XS: (0, None),
}


def random_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    _, type_size = quants.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    d = (rng.standard_normal(n_blocks) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    dmin = (rng.uniform(0, 0.01, n_blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    at_d, at_min = SCALE_OFFSETS[qtype]
    raw[:, at_d:at_d + 2] = d
    if at_min is not None:
        raw[:, at_min:at_min + 2] = dmin
    return raw.reshape(-1)


def record(qtype: T, n: int, inp: np.ndarray | None, raw: np.ndarray) -> bytes:
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    deq = quants.dequantize(raw, qtype).astype(np.float32).reshape(-1)
    assert deq.size == n, (qtype, deq.size, n)
    out = struct.pack("<4I", int(qtype), n, 0 if inp is None else 1, raw.size)
    if inp is not None:
        out += inp.astype("<f4").tobytes()
    return out + raw.tobytes() + deq.astype("<f4").tobytes()


def main() -> None:
    rng = np.random.default_rng(SEED)
    records = []
    quantized = [(T.F32, 64), (T.F16, 64), (T.BF16, 64), (T.Q8_0, 128), (T.Q4_0, 128), (T.Q4_1, 128)]
    for qtype, n in quantized:
        if qtype == T.BF16:
            x = bf16_input(rng)
        elif qtype in (T.F32, T.F16):
            x = rng.standard_normal(n).astype(np.float32)
        else:
            x = float_input(rng, n)
        if qtype == T.F16:
            x[:3] = [1e-6, 70000.0, -(2.0**-15)]  # subnormal, overflow to inf, exact subnormal
        with np.errstate(over="ignore"):
            raw = quants.quantize(x, qtype).view(np.uint8)
        records.append(record(qtype, n, x, raw))
    for qtype in (T.Q4_K, T.Q6_K):
        raw = random_blocks(rng, qtype, 2)
        records.append(record(qtype, 512, None, raw))
    # Types added later draw after the ones above, so that those records stay as they were.
    for qtype in (T.Q5_0, T.Q5_1):
        x = float_input(rng, 128)
        raw = quants.quantize(x, qtype).view(np.uint8)
        records.append(record(qtype, 128, x, raw))
    for qtype, n_blocks in [(T.Q5_0, 8), (T.Q5_1, 8), (T.IQ4_NL, 8), (T.Q2_K, 3), (T.Q3_K, 3),
                            (T.Q5_K, 3), (T.IQ4_XS, 3)]:
        raw = random_blocks(rng, qtype, n_blocks)
        n = n_blocks * quants.GGML_QUANT_SIZES[qtype][0]
        records.append(record(qtype, n, None, raw))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(b"TQFX" + struct.pack("<2I", 1, len(records)) + b"".join(records))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(records)} records)")


if __name__ == "__main__":
    main()

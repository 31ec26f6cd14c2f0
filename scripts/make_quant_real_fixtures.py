#!/usr/bin/env python3
"""Writes crates/kernels/tests/fixtures/quant_real_rows.bin: rows of real tensors, as
llama-quantize wrote them, and their dequantization by the Python `gguf` package (gguf-py,
version 0.19.0), for the row formats tandem added after the first ones (Q5_0, Q5_1, Q2_K,
Q3_K, Q5_K, IQ4_NL, IQ4_XS).

For each such type, the first tensor of that type found in the given files contributes its
first and last rows. The file layout is make_quant_fixtures.py's (records without input).

The inputs are the quantized default-model variants of bench/make_kquant_models.sh:

    bash bench/make_kquant_models.sh
    python3 scripts/make_quant_real_fixtures.py bench/.kquant/smol-q*_k*.gguf bench/.kquant/smol-iq4_xs.gguf
"""

import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants

OUT = Path(__file__).resolve().parent.parent / "crates/kernels/tests/fixtures/quant_real_rows.bin"
TYPES = [T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_NL, T.IQ4_XS]


def record(qtype: T, raw: np.ndarray) -> bytes:
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    deq = quants.dequantize(raw, qtype).astype(np.float32).reshape(-1)
    header = struct.pack("<4I", int(qtype), deq.size, 0, raw.size)
    return header + raw.tobytes() + deq.astype("<f4").tobytes()


def main() -> None:
    found = {}
    for path in sys.argv[1:]:
        for t in GGUFReader(path).tensors:
            qtype = T(t.tensor_type)
            if qtype in TYPES and qtype not in found:
                rows = np.asarray(t.data).reshape(int(np.prod(t.shape[1:])), -1)
                found[qtype] = (Path(path).name, t.name, rows)
    missing = [q.name for q in TYPES if q not in found]
    if missing:
        sys.exit(f"no tensor of type {', '.join(missing)} in the given files")
    records = []
    for qtype in TYPES:
        name, tensor, rows = found[qtype]
        print(f"{qtype.name}: {name} {tensor} ({rows.shape[0]} rows of {rows.shape[1]} bytes)")
        records += [record(qtype, rows[0]), record(qtype, rows[-1])]
    OUT.write_bytes(b"TQFX" + struct.pack("<2I", 1, len(records)) + b"".join(records))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(records)} records)")


if __name__ == "__main__":
    main()

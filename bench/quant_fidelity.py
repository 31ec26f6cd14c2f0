#!/usr/bin/env python3
"""Fidelity of quantized GGUF files: per-token log-probabilities of tandem (default int8
kernels and the exact path) and of llama.cpp on each file, against the fp32 reference of the
same file's weights, on the same token ids.

The reference is llama.cpp evaluating an F32 copy of the file (its weights dequantized by
`llama-quantize ... F32`, so by llama.cpp's own dequantization) with an f32 KV cache: ggml
multiplies F32 weights with f32 activations, so this is the exact function the quantized
weights define, computed by an implementation independent of tandem. llama.cpp's distance to
it (8-bit activations, f16 KV cache) is the peer's own distance.

    python3 bench/quant_fidelity.py M1.gguf [M2.gguf ...] [--tokens 1024] [--threads 2]

With `--reference R.json` (a model's fixture from scripts/make_gemma3_reference.py or
scripts/make_default_model_reference.py: prompts, llama.cpp's token ids and HF transformers'
fp32 log-probabilities on the dequantized weights), the reference is that file instead, on its
own prompts, for one model given by path or by tandem's name for it (`gemma3-270m`); each
prompt gets a row, and one more row pools every position. The llama.cpp F32 column is then a
second fp32 implementation measured against the first.

    python3 bench/quant_fidelity.py gemma3-270m \
        --reference crates/model/tests/fixtures/gemma3_270m/reference.json

Prints one JSON line per file (or prompt) and a Markdown table. Needs a release build of
tandem and llama.cpp from bench/build_llama_cpp.sh (libllama; bench/llama_logprobs.c is
compiled here).
"""
import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_file import gguf_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TANDEM = ROOT / "target/release/tandem"


def sh(cmd, stdin=None):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, input=stdin).stdout


def llama_tools():
    bin_dir = Path(sh(["bash", str(ROOT / "bench/build_llama_cpp.sh")]).strip().splitlines()[-1])
    src = bin_dir.parent.parent / "src/llama.cpp"
    tool = bin_dir.parent / "llama_logprobs"
    if not tool.exists() or tool.stat().st_mtime < (ROOT / "bench/llama_logprobs.c").stat().st_mtime:
        sh(["cc", "-O2", str(ROOT / "bench/llama_logprobs.c"), "-I", str(src / "include"),
            "-I", str(src / "ggml/include"), "-L", str(bin_dir), "-lllama", "-lm",
            f"-Wl,-rpath,{bin_dir}", "-o", str(tool)])
    return bin_dir, tool


def token_ids(model, n):
    prompts = json.loads((ROOT / "crates/model/tests/fixtures/default_model/prompts.json").read_text())
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("\n\n".join(prompts * 16))
        f.flush()
        out = sh([str(TANDEM), "score", "--model", model, "--file", f.name, "--json",
                  "--window", str(n), "--stride", str(n)])
    ids = json.loads(out)["tokens"]
    assert len(ids) >= n, "not enough text"
    return ids[:n]


def tandem(model, ids, threads, kernels=None):
    cmd = [str(TANDEM), "score", "--model", model, "--threads", str(threads), "--tokens",
           ",".join(map(str, ids)), "--top-k", "1", "--json"]
    if kernels:
        cmd += ["--kernels", kernels]
    out = json.loads(sh(cmd))
    # top_logprobs[i + 1] is the distribution after tokens[..=i].
    argmax = [int(next(iter(t))) if isinstance(t, dict) else t[0]["id"]
              for t in out["top_logprobs"][1:]]
    return out["token_logprobs"], argmax


def llama(tool, model, ids, threads, f32kv=False):
    cmd = [str(tool), model, str(threads)] + (["f32kv"] if f32kv else [])
    out = json.loads(sh(cmd, stdin=",".join(map(str, ids))))
    return out["token_logprobs"], out["argmax"][:-1]


def deltas(run, ref):
    """|Δlogprob| at each scored position and whether the most likely next token agrees."""
    (lp, am), (rlp, ram) = run, ref
    assert len(lp) == len(rlp) and len(am) == len(ram), "runs of different lengths"
    return [abs(a - b) for a, b in zip(lp[1:], rlp[1:])], [a == b for a, b in zip(am, ram)]


def summary(d, agree):
    return {"mean_abs_dlogprob": float(f"{sum(d) / len(d):.4g}"),
            "max_abs_dlogprob": float(f"{max(d):.4g}"),
            "top1_agreement": round(sum(agree) / len(agree), 4), "positions": len(d)}


def distance(run, ref):
    return summary(*deltas(run, ref))


def f32_copy(bin_dir, model):
    """llama.cpp's own F32 dequantization of `model`, made once beside it."""
    f32 = Path(model).with_suffix(".f32.gguf")
    if not f32.exists():
        sh([str(bin_dir / "llama-quantize"), "--allow-requantize", model, str(f32), "F32"])
    return f32


def against_reference(a, bin_dir, tool):
    """Every path against the fixture's HF fp32 log-probabilities, per prompt and pooled."""
    model = gguf_path(a.models[0])
    ref = json.loads(Path(a.reference).read_text())
    sha = hashlib.sha256(Path(model).read_bytes()).hexdigest()
    assert sha == ref["model_sha256"], f"{model} is not the file the reference was made from"
    f32 = f32_copy(bin_dir, model)
    paths = {
        "tandem_int8": lambda ids: tandem(model, ids, a.threads),
        "tandem_exact": lambda ids: tandem(model, ids, a.threads, "avx512"),
        "llama_cpp": lambda ids: llama(tool, model, ids, a.threads),
        "llama_cpp_f32": lambda ids: llama(tool, str(f32), ids, a.threads, f32kv=True),
    }
    pooled = {k: ([], []) for k in paths}
    rows = []
    for p in ref["prompts"]:
        ids, hf = p["tokens"], p["hf_fp32"]
        want = (hf["token_logprobs"], hf["argmax"][:-1])
        row = {"prompt": p["text"][:40], "tokens": len(ids)}
        for k, run in paths.items():
            d, agree = deltas(run(ids), want)
            pooled[k][0].extend(d)
            pooled[k][1].extend(agree)
            row[k] = summary(d, agree)
        print(json.dumps(row, ensure_ascii=False), flush=True)
        rows.append(row)
    row = {"prompt": "all positions", "tokens": sum(r["tokens"] for r in rows)}
    row.update({k: summary(*v) for k, v in pooled.items()})
    print(json.dumps(row), flush=True)
    rows.append(row)
    cols = list(paths)
    print("\n| prompt | tokens | " + " | ".join(cols) + " |\n|" + " --- |" * (len(cols) + 2))
    for r in rows:
        cells = [f"{r[k]['mean_abs_dlogprob']:.2e} / {100 * r[k]['top1_agreement']:.1f} %"
                 for k in cols]
        label = r["prompt"].replace("\n", "\\n").replace("|", "\\|")
        print(f"| {label} | {r['tokens']} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reference", help="a fixture with HF fp32 log-probabilities (see above)")
    a = ap.parse_args()
    bin_dir, tool = llama_tools()
    if a.reference:
        return against_reference(a, bin_dir, tool)
    a.models = [gguf_path(m) for m in a.models]
    ids = token_ids(a.models[0], a.tokens)
    rows = []
    for model in a.models:
        ref = llama(tool, str(f32_copy(bin_dir, model)), ids, a.threads, f32kv=True)
        row = {"model": Path(model).name, "tokens": len(ids),
               "tandem_int8": distance(tandem(model, ids, a.threads), ref),
               "tandem_exact": distance(tandem(model, ids, a.threads, "avx512"), ref),
               "llama_cpp": distance(llama(tool, model, ids, a.threads), ref)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| file | tandem int8 | tandem exact | llama.cpp |\n| --- | --- | --- | --- |")
    for r in rows:
        cells = [f"{r[k]['mean_abs_dlogprob']:.4f} / {100 * r[k]['top1_agreement']:.1f} %"
                 for k in ("tandem_int8", "tandem_exact", "llama_cpp")]
        print(f"| {r['model']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

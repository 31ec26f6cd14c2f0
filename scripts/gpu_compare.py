#!/usr/bin/env python3
"""Compares the CUDA backend's logprobs with torch's references.

Usage: gpu_compare.py OUTDIR MODEL_DIR_ROOT NAME ...

Reads MODEL_DIR_ROOT/ref_<name>.json and OUTDIR/cuda_<name>_<dtype>.json (from
`cuda_score score`) and OUTDIR/check_<name>_<dtype>.json (from `cuda_score check`), and
writes OUTDIR/results.json and OUTDIR/summary.txt: mean and max |logprob difference| against
torch fp32 for tandem f32, tandem bf16 and torch bf16, plus the check results.
Goals: f32 max <= 3e-4 and mean <= 2e-5; bf16 no worse than torch bf16.
"""
import json
import os
import sys


def diffs(a, b):
    flat = [abs(x - y) for sa, sb in zip(a, b) for x, y in zip(sa, sb)]
    n_a = sum(len(s) for s in a)
    n_b = sum(len(s) for s in b)
    if not flat or n_a != n_b:
        return None
    return {"mean": sum(flat) / len(flat), "max": max(flat), "n": len(flat)}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def compare(outdir, root, name):
    ref = load(os.path.join(root, f"ref_{name}.json"))
    if ref is None:
        return {"error": "no reference"}
    r = {"torch_bf16_vs_torch_f32": diffs(ref["bf16_logprobs"], ref["f32_logprobs"])}
    for dtype in ["f32", "bf16"]:
        got = load(os.path.join(outdir, f"cuda_{name}_{dtype}.json"))
        r[f"tandem_{dtype}_vs_torch_f32"] = (
            diffs(got["logprobs"], ref["f32_logprobs"]) if got else None)
        r[f"check_{dtype}"] = load(os.path.join(outdir, f"check_{name}_{dtype}.json"))
    f32 = r["tandem_f32_vs_torch_f32"]
    bf16 = r["tandem_bf16_vs_torch_f32"]
    torch_bf16 = r["torch_bf16_vs_torch_f32"]
    r["f32_goal_met"] = bool(f32 and f32["max"] <= 3e-4 and f32["mean"] <= 2e-5)
    r["bf16_goal_met"] = bool(bf16 and torch_bf16 and bf16["mean"] <= torch_bf16["mean"]
                              and bf16["max"] <= torch_bf16["max"])
    return r


def fmt(d):
    return "missing" if not d else f"mean {d['mean']:.2e}  max {d['max']:.2e}"


def summary_lines(name, r):
    if "error" in r:
        return [f"{name}: {r['error']}"]
    lines = [f"== {name}",
             f"  tandem f32  vs torch f32: {fmt(r['tandem_f32_vs_torch_f32'])}"
             f"  goal {'met' if r['f32_goal_met'] else 'NOT met'}",
             f"  tandem bf16 vs torch f32: {fmt(r['tandem_bf16_vs_torch_f32'])}"
             f"  goal {'met' if r['bf16_goal_met'] else 'NOT met'}",
             f"  torch  bf16 vs torch f32: {fmt(r['torch_bf16_vs_torch_f32'])}"]
    for dtype in ["f32", "bf16"]:
        c = r[f"check_{dtype}"]
        if not c:
            lines.append(f"  checks {dtype}: missing")
            continue
        d, p, t = c["decode_vs_forward"], c["prefix"], c["timing"]
        lines.append(
            f"  checks {dtype}: decode=forward max|d| {d['max_abs_diff']:.2e}; prefix suffix "
            f"max|dlogit| {p['suffix_max_abs_logit_diff']:.2e}; cached_logits mismatches "
            f"{p['cached_logits_mismatches']} (after copy_blocks "
            f"{p['cached_logits_after_copy_mismatches']})")
        inv = c.get("batch_invariance", {})
        for mode, v in inv.items():
            lines.append(
                f"  batch invariance {dtype} {mode}: B={v['batch']} together vs alone: "
                f"{v['mismatched_logits']} logits differ, max|d| {v['max_abs_diff']:.2e}, "
                f"batched step {v.get('step_ms', 0):.2f} ms")
        for key in ("device_logprobs", "device_greedy", "device_sample"):
            v = c.get(key)
            if v is not None:
                lines.append(f"  {key} {dtype}: {v['differ']} of "
                             f"{v.get('positions', v.get('rows'))} differ from the host "
                             f"(goal 0); {json.dumps({k: x for k, x in v.items() if k.endswith(('_ms', '_differ'))})}")
        ov = c.get("overlap")
        if ov is not None:
            rates = ", ".join(
                f"B={b} {ov[f'decode_b{b}_sequential_tok_s']:.1f} -> "
                f"{ov[f'decode_b{b}_overlapped_tok_s']:.1f} tok/s"
                for b in (1, 16, 64) if f"decode_b{b}_overlapped_tok_s" in ov)
            lines.append(f"  overlapped steps {dtype}: overlap_differ {ov['overlap_differ']} of "
                         f"{ov['rows']} rows (goal 0); decode sequential -> overlapped: {rates}")
        tc = c.get("tensor_core_attention")
        if tc is not None:
            dvf = tc.get("decode_vs_forward", {}).get("max_abs_diff")
            folded = [tc.get(f"decode_vs_forward_{k}", {}).get("max_abs_diff")
                      for k in ("folded", "per_partition")]
            lines.append(
                f"  tensor-core attention {dtype}: max|dlogprob| vs tiled "
                f"{tc['max_abs_logprob_diff']:.2e}; 8x2048 prefill "
                f"{tc['prefill_8x2048_tok_s_tiled']:.0f} -> "
                f"{tc['prefill_8x2048_tok_s_tensor_cores']:.0f} tok/s; decode=forward max|d| "
                + (f"{dvf:.2e} (goal 0)" if dvf is not None else "missing")
                + "; with the scoring folded / per partition "
                + " / ".join(f"{x:.2e}" if x is not None else "missing" for x in folded)
                + " (goal 0)")
        lines.append(
            f"  speed {dtype}: prefill {t['prefill_tok_s']:.0f} tok/s ({t['prefill_tokens']} "
            f"tokens), 8x2048 {t.get('prefill_8x2048_tok_s', 0):.0f} tok/s")
        for b in (1, 16, 64, 256):
            g, e = t.get(f"decode_b{b}_graphs_tok_s"), t.get(f"decode_b{b}_eager_tok_s")
            p = t.get(f"decode_b{b}_greedy_tok_s")
            s = t.get(f"decode_b{b}_top_p_tok_s")
            if g is not None:
                lines.append(f"  decode {dtype} B={b}: graphs {g:.1f} tok/s, eager {e:.1f} tok/s"
                             + (f", graphs + greedy picks on the device {p:.1f} tok/s" if p else "")
                             + (f", graphs + top-p draws on the device {s:.1f} tok/s" if s else ""))
    return lines


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    outdir, root, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    results = {name: compare(outdir, root, name) for name in names}
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [line for name in names for line in summary_lines(name, results[name])]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(outdir, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()

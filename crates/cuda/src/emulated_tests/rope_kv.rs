//! `qkv_rope_store`: bias, q/k head norms and RoPE of the fused projection's output, and
//! the store of keys and values at each token's slot of the paged cache.

use super::*;
use crate::kernels::{QkvBuffers, QkvShape};

struct Case {
    heads: usize,
    kv_heads: usize,
    d: usize,
    neox: bool,
    bias: bool,
    qk_norm: bool,
}

fn check(dtype: CudaDtype, c: &Case, seed: u64) {
    let k = kernels(dtype);
    let (n, num_slots) = (5, 16);
    let (q_dim, kv_dim) = (c.heads * c.d, c.kv_heads * c.d);
    let row = q_dim + 2 * kv_dim;
    let half = c.d / 2;
    let mut r = rng(seed);
    let qkv = normal_ish(&mut r, n * row, 1.5);
    let bias = normal_ish(&mut r, row, 0.5);
    let norm_w = normal_ish(&mut r, 2 * c.d, 1.0);
    let angles = normal_ish(&mut r, n * half, 3.0);
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let slots = [3i64, 15, 0, 8, 9];
    let (mut qb, mut bb, mut nb) = (Buf::of(&qkv), Buf::of(&bias), Buf::of(&norm_w));
    let (mut cb, mut sb, mut slb) = (Buf::of(&cos), Buf::of(&sin), Buf::of(&slots));
    let mut q_out = Buf::zeroed(n * q_dim * 4);
    let mut k_cache = act_buf(dtype, &vec![0.0; num_slots * kv_dim]);
    let mut v_cache = act_buf(dtype, &vec![0.0; num_slots * kv_dim]);
    let bufs = QkvBuffers {
        qkv: qb.ptr(),
        bias: c.bias.then(|| bb.ptr()),
        qk_norm: c.qk_norm.then(|| nb.ptr()),
        cos: cb.ptr(),
        sin: sb.ptr(),
        slots: slb.ptr(),
        q_out: q_out.ptr(),
        k_cache: k_cache.ptr(),
        v_cache: v_cache.ptr(),
    };
    let shape = QkvShape {
        num_heads: c.heads as i32,
        num_kv_heads: c.kv_heads as i32,
        head_dim: c.d as i32,
        neox: c.neox as i32,
        has_bias: c.bias as i32,
        has_qk_norm: c.qk_norm as i32,
        eps: 1e-6,
    };
    k.qkv_rope_store(&bufs, shape, n).expect("launch");

    let (q_got, k_got, v_got) = (
        q_out.read::<f32>(),
        read_act(dtype, &k_cache),
        read_act(dtype, &v_cache),
    );
    let what = format!("{dtype:?} d={} neox={}", c.d, c.neox);
    for t in 0..n {
        let added: Vec<f32> = (0..row)
            .map(|i| qkv[t * row + i] + if c.bias { bias[i] } else { 0.0 })
            .collect();
        // Reference of one q or k head: norm, then rotation, in f64.
        let head = |col: usize, w: &[f32]| -> Vec<f64> {
            let mut v: Vec<f64> = added[col..col + c.d].iter().map(|&x| x as f64).collect();
            if c.qk_norm {
                let ms = v.iter().map(|x| x * x).sum::<f64>() / c.d as f64;
                let s = 1.0 / (ms + 1e-6).sqrt();
                v.iter_mut().zip(w).for_each(|(x, &w)| *x *= s * w as f64);
            }
            let mut out = v.clone();
            for i in 0..half {
                let (a, b) = if c.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (co, si) = (cos[t * half + i] as f64, sin[t * half + i] as f64);
                out[a] = v[a] * co - v[b] * si;
                out[b] = v[a] * si + v[b] * co;
            }
            out
        };
        for h in 0..c.heads {
            let want = head(h * c.d, &norm_w[..c.d]);
            let got = &q_got[t * q_dim + h * c.d..t * q_dim + (h + 1) * c.d];
            assert_close(&format!("{what}: q token {t} head {h}"), got, &want, 2e-5);
        }
        let slot = slots[t] as usize;
        for h in 0..c.kv_heads {
            let want = head(q_dim + h * c.d, &norm_w[c.d..]);
            let at = slot * kv_dim + h * c.d;
            let got = &k_got[at..at + c.d];
            assert_close(
                &format!("{what}: k token {t} head {h}"),
                got,
                &want,
                tolerance(dtype),
            );
            let v_want = as_stored(dtype, &added[q_dim + kv_dim + h * c.d..][..c.d]);
            assert_eq!(
                &v_got[at..at + c.d],
                &v_want[..],
                "{what}: v token {t} head {h}"
            );
        }
    }
    // Slots no token wrote stay untouched.
    for slot in (0..num_slots).filter(|s| !slots.contains(&(*s as i64))) {
        let untouched = k_got[slot * kv_dim..(slot + 1) * kv_dim]
            .iter()
            .all(|&v| v == 0.0);
        assert!(untouched, "{what}: slot {slot} was written");
    }
}

#[test]
fn llama_style_heads_with_bias() {
    for dtype in MODES {
        let c = Case {
            heads: 4,
            kv_heads: 2,
            d: 64,
            neox: true,
            bias: true,
            qk_norm: false,
        };
        check(dtype, &c, 11);
    }
}

#[test]
fn interleaved_pairs_with_qk_norm_and_a_head_wider_than_a_warp_multiple() {
    for dtype in MODES {
        // d = 80: the block is 96 threads, 16 of which hold no element.
        let c = Case {
            heads: 3,
            kv_heads: 1,
            d: 80,
            neox: false,
            bias: false,
            qk_norm: true,
        };
        check(dtype, &c, 12);
    }
}

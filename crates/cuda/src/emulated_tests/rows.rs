//! The row kernels: embedding gather, residual add + RMSNorm, the final norm into the
//! hidden store and its gather, the norm of a row in place, the gated activations (SwiGLU,
//! GeGLU) and the soft cap.

use super::*;
use tandem_model::config::Activation;

const EPS: f32 = 1e-5;

fn rms_reference(x: &[f32], w: &[f32]) -> Vec<f64> {
    let mean_sq = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (mean_sq + EPS as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &w)| v as f64 * scale * w as f64)
        .collect()
}

#[test]
fn embed_gather_copies_the_rows_of_the_tokens() {
    for dtype in MODES {
        let k = kernels(dtype);
        let (vocab, h) = (50, 300);
        let table = normal_ish(&mut rng(1), vocab * h, 1.0);
        let tokens = [7i32, 0, 49, 7, 13];
        let (mut tb, mut tk) = (act_buf(dtype, &table), Buf::of(&tokens));
        let mut x = Buf::zeroed(tokens.len() * h * 4);
        k.embed_gather(tb.ptr(), tk.ptr(), x.ptr(), (tokens.len(), h), 1.0)
            .expect("launch");
        let stored = as_stored(dtype, &table);
        let want: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| stored[t as usize * h..(t as usize + 1) * h].to_vec())
            .collect();
        assert_eq!(x.read::<f32>(), want, "{dtype:?}");
        // Gemma's scale, applied in f32 after the row is read.
        let scale = (h as f32).sqrt();
        k.embed_gather(tb.ptr(), tk.ptr(), x.ptr(), (tokens.len(), h), scale)
            .expect("launch");
        let scaled: Vec<f32> = want.iter().map(|v| v * scale).collect();
        assert_eq!(x.read::<f32>(), scaled, "{dtype:?}: scaled");
    }
}

#[test]
fn add_rms_norm_adds_the_residual_and_norms_each_row() {
    for dtype in MODES {
        let k = kernels(dtype);
        // A width that is not a multiple of the block's 256 threads.
        let (n, h) = (3, 576);
        let mut r = rng(2);
        let x0 = normal_ish(&mut r, n * h, 2.0);
        let delta = normal_ish(&mut r, n * h, 1.0);
        let weight = normal_ish(&mut r, h, 1.0);
        for with_delta in [false, true] {
            let (mut x, mut d, mut w) = (Buf::of(&x0), Buf::of(&delta), Buf::of(&weight));
            let mut out = act_buf(dtype, &vec![0.0; n * h]);
            let dp = with_delta.then(|| d.ptr());
            k.add_rms_norm(x.ptr(), dp, w.ptr(), out.ptr(), n, h, EPS)
                .expect("launch");
            let summed: Vec<f32> = if with_delta {
                x0.iter().zip(&delta).map(|(a, b)| a + b).collect()
            } else {
                x0.clone()
            };
            assert_eq!(x.read::<f32>(), summed, "{dtype:?}: x after the add");
            let want: Vec<f64> = summed
                .chunks(h)
                .flat_map(|row| rms_reference(row, &weight))
                .collect();
            let what = format!("{dtype:?} add_rms_norm (delta {with_delta})");
            assert_close(&what, &read_act(dtype, &out), &want, tolerance(dtype));
        }
    }
}

#[test]
fn final_norm_store_and_gather_hidden_round_trip_through_the_slots() {
    for dtype in MODES {
        let k = kernels(dtype);
        let (n, h, num_slots) = (4, 320, 10);
        let mut r = rng(3);
        let x0 = normal_ish(&mut r, n * h, 1.0);
        let delta = normal_ish(&mut r, n * h, 1.0);
        let weight = normal_ish(&mut r, h, 1.0);
        let slots = [9i64, 2, 5, 0];
        let (mut x, mut d, mut w, mut s) = (
            Buf::of(&x0),
            Buf::of(&delta),
            Buf::of(&weight),
            Buf::of(&slots),
        );
        let mut store = Buf::of(&vec![f32::NAN; num_slots * h]);
        k.final_norm_store(x.ptr(), d.ptr(), w.ptr(), s.ptr(), store.ptr(), n, h, EPS)
            .expect("launch");
        let held = store.read::<f32>();
        for (t, &slot) in slots.iter().enumerate() {
            let row: Vec<f32> = (0..h).map(|i| x0[t * h + i] + delta[t * h + i]).collect();
            let got = &held[slot as usize * h..(slot as usize + 1) * h];
            assert_close("final_norm_store", got, &rms_reference(&row, &weight), 2e-5);
        }
        // Gather slots 5 and 9 back, in that order.
        let wanted = [5i64, 9];
        let mut ws = Buf::of(&wanted);
        let mut out = act_buf(dtype, &vec![0.0; 2 * h]);
        k.gather_hidden(store.ptr(), ws.ptr(), out.ptr(), 2, h)
            .expect("launch");
        let want: Vec<f32> = wanted
            .iter()
            .flat_map(|&s| as_stored(dtype, &held[s as usize * h..(s as usize + 1) * h]))
            .collect();
        assert_eq!(read_act(dtype, &out), want, "{dtype:?}: gather_hidden");
    }
}

/// `act(gate) * up` in f64, for SwiGLU or GeGLU (GELU's tanh approximation).
fn gated_reference(gate_up: &[f32], ff: usize, act: Activation) -> Vec<f64> {
    gate_up
        .chunks(2 * ff)
        .flat_map(|row| {
            (0..ff).map(move |i| {
                let g = row[i] as f64;
                let a = match act {
                    Activation::Silu => g / (1.0 + (-g).exp()),
                    Activation::GeluTanh => {
                        let inner =
                            (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g.powi(3));
                        0.5 * g * (1.0 + inner.tanh())
                    }
                };
                a * row[ff + i] as f64
            })
        })
        .collect()
}

#[test]
fn gated_activation_is_the_activation_of_the_gate_times_up() {
    for dtype in MODES {
        for act in [Activation::Silu, Activation::GeluTanh] {
            let k = kernels(dtype);
            // Rows longer than one block of 256 threads, and not a multiple of it.
            let (n, ff) = (2, 600);
            let gate_up = normal_ish(&mut rng(4), n * 2 * ff, 4.0);
            let mut gu = Buf::of(&gate_up);
            let mut out = act_buf(dtype, &vec![0.0; n * ff]);
            k.gated_activation(gu.ptr(), out.ptr(), (n, ff), act)
                .expect("launch");
            assert_close(
                &format!("{dtype:?} {act:?}"),
                &read_act(dtype, &out),
                &gated_reference(&gate_up, ff, act),
                tolerance(dtype),
            );
        }
    }
}

#[test]
fn rms_norm_rows_norms_in_place_and_soft_cap_caps() {
    let k = kernels(CudaDtype::F32);
    let (n, h) = (3, 576);
    let mut r = rng(5);
    let x0 = normal_ish(&mut r, n * h, 3.0);
    let weight = normal_ish(&mut r, h, 1.0);
    let (mut x, mut w) = (Buf::of(&x0), Buf::of(&weight));
    k.rms_norm_rows(x.ptr(), w.ptr(), (n, h), EPS)
        .expect("launch");
    let want: Vec<f64> = x0
        .chunks(h)
        .flat_map(|row| rms_reference(row, &weight))
        .collect();
    assert_close("rms_norm_rows", &x.read::<f32>(), &want, 2e-6);
    let cap = 2.5;
    k.soft_cap(x.ptr(), (n, h), cap).expect("launch");
    let capped: Vec<f64> = want
        .iter()
        .map(|v| (v / cap as f64).tanh() * cap as f64)
        .collect();
    assert_close("soft_cap", &x.read::<f32>(), &capped, 2e-6);
}

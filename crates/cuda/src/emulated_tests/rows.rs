//! The row kernels: embedding gather, residual add + RMSNorm, the final norm into the
//! hidden store and its gather, SwiGLU.

use super::*;

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
        k.embed_gather(tb.ptr(), tk.ptr(), x.ptr(), tokens.len(), h)
            .expect("launch");
        let stored = as_stored(dtype, &table);
        let want: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| stored[t as usize * h..(t as usize + 1) * h].to_vec())
            .collect();
        assert_eq!(x.read::<f32>(), want, "{dtype:?}");
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

#[test]
fn swiglu_is_silu_of_the_gate_times_up() {
    for dtype in MODES {
        let k = kernels(dtype);
        // Rows longer than one block of 256 threads, and not a multiple of it.
        let (n, ff) = (2, 600);
        let gate_up = normal_ish(&mut rng(4), n * 2 * ff, 4.0);
        let mut gu = Buf::of(&gate_up);
        let mut out = act_buf(dtype, &vec![0.0; n * ff]);
        k.swiglu(gu.ptr(), out.ptr(), n, ff).expect("launch");
        let want: Vec<f64> = gate_up
            .chunks(2 * ff)
            .flat_map(|row| {
                (0..ff).map(move |i| {
                    let g = row[i] as f64;
                    g / (1.0 + (-g).exp()) * row[ff + i] as f64
                })
            })
            .collect();
        assert_close(
            &format!("{dtype:?} swiglu"),
            &read_act(dtype, &out),
            &want,
            tolerance(dtype),
        );
    }
}

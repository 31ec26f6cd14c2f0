//! The processors and top logits of rows drawn where the logits are: `process_rows`
//! rewrites exactly the listed logits to the host's processed values
//! (`tandem_model::logit_processing`), bit for bit; `sample_rows` then draws the reference's
//! token (`RowDraw::pick`); `restore_rows` gives back the raw rows bit for bit; and
//! `top_logits` finds the reference's most likely tokens (`token_pick::top_logprobs`).

use super::*;
use tandem_model::batch::TokenId;
use tandem_model::logit_processing::{LogitProcessing, TokenAdjustment};
use tandem_model::row_sampling::{RowDraw, RowSampling};
use tandem_model::token_pick::top_logprobs;

use crate::row_kernels::{append_processing, row_sampling_bytes, TOP_LOGITS_MAX};

const VOCAB: usize = 700;

/// Processors of every kind over `n` random distinct tokens of a row.
fn processing(r: &mut StdRng, n: usize, repetition_penalty: f32) -> LogitProcessing {
    let mut ids: Vec<u32> = (0..n).map(|_| r.random_range(0..VOCAB as u32)).collect();
    ids.sort_unstable();
    ids.dedup();
    LogitProcessing {
        repetition_penalty,
        presence_penalty: r.random_range(-2.0..2.0),
        frequency_penalty: r.random_range(-2.0..2.0),
        tokens: ids
            .into_iter()
            .map(|id| TokenAdjustment {
                id,
                bias: if r.random_bool(0.3) {
                    r.random_range(-100.0..100.0f32) as f64 + 0.1f32 as f64
                } else {
                    0.0
                },
                count: if r.random_bool(0.5) {
                    r.random_range(1..5)
                } else {
                    0
                },
                seen: r.random_bool(0.7),
                suppressed: r.random_bool(0.05),
            })
            .collect(),
    }
}

#[test]
fn processed_draws_are_the_references_and_the_raw_rows_come_back() {
    let mut r = rng(31);
    let mut logits = Vec::new();
    let mut draws = Vec::new();
    for i in 0..60usize {
        let mut row = normal_ish(&mut r, VOCAB, 4.0);
        if i % 3 == 0 {
            row.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0); // ties
        }
        let sampling = RowSampling {
            temperature: [0.0, 0.7, 1.0, 1.5][i % 4],
            top_k: [0, 5, 50, 0][i % 4],
            top_p: [1.0, 0.9, 1.0, 0.6][(i / 4) % 4],
            min_p: [0.0, 0.0, 0.05][i % 3],
            uniform: r.random::<f64>(),
        };
        let penalty = [1.0, 1.3, 0.7, 1e-30][i % 4];
        let mut d = RowDraw::plain(sampling);
        if i % 5 != 4 {
            d.processing = processing(&mut r, 1 + i * 7, penalty);
        }
        logits.push(row);
        draws.push(d);
    }
    let k = kernels(CudaDtype::Bf16);
    let flat: Vec<f32> = logits.iter().flatten().copied().collect();
    let (mut rows, mut tokens) = (Vec::new(), Vec::new());
    draws
        .iter()
        .for_each(|d| append_processing(&d.processing, &mut rows, &mut tokens));
    let params: Vec<u8> = draws
        .iter()
        .flat_map(|d| row_sampling_bytes(&d.sampling))
        .collect();
    let (mut l, mut rp, mut tk) = (Buf::of(&flat), Buf::of(&rows), Buf::of(&tokens));
    let mut saved = Buf::zeroed(tokens.len().max(1));
    let (mut p, mut t) = (Buf::of(&params), Buf::zeroed(draws.len() * 4));
    let n = draws.len();
    k.process_rows(l.ptr(), rp.ptr(), tk.ptr(), saved.ptr(), n, VOCAB, false)
        .expect("launch");
    let processed = l.read::<f32>();
    for (i, (row, d)) in logits.iter().zip(&draws).enumerate() {
        let mut want = row.clone();
        d.processing.apply(&mut want);
        let got = &processed[i * VOCAB..(i + 1) * VOCAB];
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "row {i} token {j}: {g} vs {w}");
        }
    }
    k.sample_rows(l.ptr(), p.ptr(), n, VOCAB, t.ptr())
        .expect("launch");
    k.process_rows(l.ptr(), rp.ptr(), tk.ptr(), saved.ptr(), n, VOCAB, true)
        .expect("launch");
    let restored = l.read::<f32>();
    assert!(
        restored
            .iter()
            .zip(&flat)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the raw rows come back"
    );
    let got = t.read::<i32>();
    let mut changed = 0;
    for (i, (row, d)) in logits.iter().zip(&draws).enumerate() {
        let want = d.pick(row).map_or(-1, |p| p.token.0 as i32);
        assert_eq!(got[i], want, "row {i}: {:?}", d.sampling);
        let unprocessed = RowDraw::plain(d.sampling)
            .pick(row)
            .map(|p| p.token.0 as i32);
        changed += usize::from(unprocessed != Some(want));
    }
    assert!(changed > 10, "the processors change draws: {changed}");
}

#[test]
fn top_logits_are_the_references_most_likely_tokens() {
    let mut r = rng(32);
    let mut logits = Vec::new();
    let mut counts = Vec::new();
    for i in 0..41usize {
        let mut row = normal_ish(&mut r, VOCAB, 3.0);
        if i % 2 == 0 {
            row.iter_mut().for_each(|v| *v = (*v * 1.5).round()); // many ties
        }
        if i == 40 {
            row = vec![0.25; VOCAB]; // every value tied
            (row[9], row[600]) = (-0.0, 0.0);
        }
        logits.push(row);
        counts.push((i % (TOP_LOGITS_MAX + 1)) as i32);
    }
    let k = kernels(CudaDtype::F32);
    let flat: Vec<f32> = logits.iter().flatten().copied().collect();
    let (mut l, mut c) = (Buf::of(&flat), Buf::of(&counts));
    let n = logits.len();
    let mut ids = Buf::of(&vec![-7i32; n * TOP_LOGITS_MAX]);
    let mut values = Buf::zeroed(n * TOP_LOGITS_MAX * 4);
    k.top_logits(l.ptr(), c.ptr(), n, VOCAB, ids.ptr(), values.ptr())
        .expect("launch");
    let (ids, values) = (ids.read::<i32>(), values.read::<f32>());
    for (i, row) in logits.iter().enumerate() {
        let want = top_logprobs(row, counts[i] as usize);
        let at = i * TOP_LOGITS_MAX;
        for (j, (TokenId(id), _)) in want.iter().enumerate() {
            assert_eq!(ids[at + j], *id as i32, "row {i} rank {j}");
            assert_eq!(values[at + j].to_bits(), row[*id as usize].to_bits());
        }
        assert!(
            ids[at + want.len()..at + TOP_LOGITS_MAX]
                .iter()
                .all(|&x| x == -7),
            "row {i}: nothing past the count"
        );
    }
}

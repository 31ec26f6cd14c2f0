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
    k.process_rows(
        l.ptr(),
        rp.ptr(),
        tk.ptr(),
        saved.ptr(),
        None,
        n,
        VOCAB,
        false,
    )
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
    k.process_rows(
        l.ptr(),
        rp.ptr(),
        tk.ptr(),
        saved.ptr(),
        None,
        n,
        VOCAB,
        true,
    )
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

/// The device's draws follow the engine sampler's distribution
/// (`tandem_engine::sampler::processed_distribution`) for a request with every processor,
/// built as the engine builds it (`SamplingParams::row_draw`): a chi-square test over
/// 3,000 draws with independent uniform numbers, and no draw of a token the sampler gives
/// probability 0.
#[test]
fn draws_follow_the_samplers_distribution() {
    use tandem_engine::sampler::{processed_distribution, SamplerState, SamplingParams};
    const V: usize = 48;
    const DRAWS: usize = 3000;
    let mut r = rng(33);
    let row = normal_ish(&mut r, V, 2.5);
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 30,
        top_p: 0.95,
        min_p: 0.02,
        repetition_penalty: 1.2,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        logit_bias: vec![(3, 2.0), (11, -1.0)],
        min_tokens: 4,
        stop_token_ids: vec![7],
        ..SamplingParams::default()
    };
    let mut state = SamplerState::new(1, &[1, 2, 3, 20]);
    for t in [2, 5, 5, 30] {
        state.append_output(t);
    }
    let want = processed_distribution(&row, &params, &mut state, 3).expect("a distribution");
    let draws: Vec<RowDraw> = (0..DRAWS)
        .map(|_| params.row_draw(&state, 3, r.random::<f64>(), V))
        .collect();
    let k = kernels(CudaDtype::F32);
    let flat: Vec<f32> = (0..DRAWS).flat_map(|_| row.iter().copied()).collect();
    let (mut rows, mut tokens) = (Vec::new(), Vec::new());
    draws
        .iter()
        .for_each(|d| append_processing(&d.processing, &mut rows, &mut tokens));
    let params_bytes: Vec<u8> = draws
        .iter()
        .flat_map(|d| row_sampling_bytes(&d.sampling))
        .collect();
    let (mut l, mut rp, mut tk) = (Buf::of(&flat), Buf::of(&rows), Buf::of(&tokens));
    let mut saved = Buf::zeroed(tokens.len());
    let (mut p, mut t) = (Buf::of(&params_bytes), Buf::zeroed(DRAWS * 4));
    k.process_rows(
        l.ptr(),
        rp.ptr(),
        tk.ptr(),
        saved.ptr(),
        None,
        DRAWS,
        V,
        false,
    )
    .expect("launch");
    k.sample_rows(l.ptr(), p.ptr(), DRAWS, V, t.ptr())
        .expect("launch");
    let mut counts = [0usize; V];
    for token in t.read::<i32>() {
        counts[usize::try_from(token).expect("a token")] += 1;
    }
    // Bins of at least 5 expected draws, the rest pooled.
    let (mut chi2, mut bins, mut pooled) = (0.0, 0usize, (0.0, 0.0));
    for (id, &c) in counts.iter().enumerate() {
        let expected = want.prob(id as u32) * DRAWS as f64;
        if expected == 0.0 {
            assert_eq!(c, 0, "token {id} has probability 0");
        } else if expected >= 5.0 {
            chi2 += (c as f64 - expected).powi(2) / expected;
            bins += 1;
        } else {
            pooled = (pooled.0 + expected, pooled.1 + c as f64);
        }
    }
    if pooled.0 > 0.0 {
        chi2 += (pooled.1 - pooled.0).powi(2) / pooled.0;
        bins += 1;
    }
    let df = (bins - 1) as f64;
    assert!(bins >= 8, "a spread distribution: {bins} bins");
    // Far in the tail: P(chi2 > df + 7 sqrt(2 df)) is below 1e-6 for these df.
    assert!(
        chi2 < df + 7.0 * (2.0 * df).sqrt(),
        "chi2 {chi2:.1} over {bins} bins"
    );
    assert_eq!(
        counts[7], 0,
        "the stop token is suppressed before min_tokens"
    );
}

// The device reports as many top logprobs as a request may ask for (a request asking for
// more would fail its whole step): checked when the tests compile.
const _: () = assert!(TOP_LOGITS_MAX >= tandem_engine::sampler::MAX_TOP_LOGPROBS);

#[test]
fn a_carried_token_counts_once_more_for_the_penalties() {
    let mut r = rng(33);
    let mut logits = Vec::new();
    let mut lists = Vec::new();
    let mut carried = Vec::new();
    for i in 0..48usize {
        logits.push(normal_ish(&mut r, VOCAB, 4.0));
        let mut p = processing(&mut r, 1 + i * 5, [1.0, 1.3, 0.7][i % 3]);
        p.tokens.iter_mut().for_each(|t| t.suppressed = false);
        if i % 6 == 5 {
            (p.presence_penalty, p.frequency_penalty) = (0.0, 0.0);
            p.repetition_penalty = 1.0; // no penalty: the carried token changes nothing
        }
        // A listed token, an unlisted one, a failed pick, or nothing carried.
        let c = match i % 4 {
            0 if !p.tokens.is_empty() => p.tokens[r.random_range(0..p.tokens.len())].id as i32,
            3 => -1,
            _ => loop {
                let id = r.random_range(0..VOCAB as u32);
                if p.tokens.iter().all(|t| t.id != id) {
                    break id as i32;
                }
            },
        };
        lists.push(p);
        carried.push(c);
    }
    let k = kernels(CudaDtype::F32);
    let flat: Vec<f32> = logits.iter().flatten().copied().collect();
    let (mut rows, mut tokens) = (Vec::new(), Vec::new());
    lists
        .iter()
        .for_each(|p| append_processing(p, &mut rows, &mut tokens));
    let (mut l, mut rp, mut tk) = (Buf::of(&flat), Buf::of(&rows), Buf::of(&tokens));
    let mut saved = Buf::zeroed(tokens.len().max(4));
    let (mut c, mut cs) = (Buf::of(&carried), Buf::zeroed(carried.len() * 4));
    let n = lists.len();
    let with = Some((c.ptr(), cs.ptr()));
    let (logits_ptr, rows_ptr, tokens_ptr, saved_ptr) = (l.ptr(), rp.ptr(), tk.ptr(), saved.ptr());
    let run = |restore| {
        k.process_rows(
            logits_ptr, rows_ptr, tokens_ptr, saved_ptr, with, n, VOCAB, restore,
        )
        .expect("launch")
    };
    run(false);
    let processed = l.read::<f32>();
    let mut counted = 0;
    for (i, (row, p)) in logits.iter().zip(&lists).enumerate() {
        let next = match carried[i] {
            c if c >= 0 => p.with_output(c as u32),
            _ => p.clone(),
        };
        counted += usize::from(next != *p);
        let mut want = row.clone();
        next.apply(&mut want);
        let got = &processed[i * VOCAB..(i + 1) * VOCAB];
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "row {i} token {j}: {g} vs {w}");
        }
    }
    assert!(counted > 20, "the carried tokens change {counted} lists");
    run(true);
    let restored = l.read::<f32>();
    let same = restored
        .iter()
        .zip(&flat)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "the raw rows come back, carried tokens included");
}

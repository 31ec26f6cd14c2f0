//! Logprobs are those of the raw model distribution: `log_softmax` of the unprocessed
//! logits, equal to the scoring path's numbers bit for bit.

mod sampler_reference;

use sampler_reference::synthetic_logits;
use tandem_engine::model::logits::Logits;
use tandem_engine::sampler::{sample, SamplerError, SamplerState, SamplingParams};

/// f64 log-softmax written directly from the definition.
fn log_softmax_f64(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .map(|&v| v as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let lse = max
        + row
            .iter()
            .map(|&v| (v as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&v| v as f64 - lse).collect()
}

fn processed_params() -> SamplingParams {
    SamplingParams {
        temperature: 0.6,
        top_k: 8,
        top_p: 0.9,
        min_p: 0.02,
        repetition_penalty: 1.4,
        presence_penalty: 1.0,
        frequency_penalty: 0.5,
        logit_bias: vec![(3, 5.0), (7, -50.0)],
        logprobs: true,
        top_logprobs: 5,
        ..SamplingParams::default()
    }
}

#[test]
fn chosen_logprob_is_the_raw_log_softmax() {
    let reported = |p: SamplingParams| SamplingParams {
        logprobs: true,
        ..p
    };
    for (i, params) in [
        reported(SamplingParams::default()),
        reported(SamplingParams::greedy()),
        processed_params(),
    ]
    .into_iter()
    .enumerate()
    {
        let mut state = SamplerState::new(i as u64, &[3, 4, 5]);
        for step in 0..200 {
            let row = synthetic_logits(300, 3.0, step);
            let exact = log_softmax_f64(&row);
            let scored = Logits::new(vec![0], row.len(), row.clone())
                .log_probs(0)
                .expect("finite");
            let s = sample(&row, &params, &mut state, step as usize).expect("finite");
            let t = s.token as usize;
            let logprob = s.logprob.expect("asked for");
            assert!((logprob as f64 - exact[t]).abs() < 1e-5, "step {step}");
            assert_eq!(
                logprob.to_bits(),
                scored[t].to_bits(),
                "not bitwise = scoring"
            );
            state.append_output(s.token);
        }
    }
}

#[test]
fn top_logprobs_are_the_raw_top_n_sorted() {
    let params = processed_params();
    let mut state = SamplerState::new(1, &[]);
    for step in 0..100 {
        let mut row = synthetic_logits(300, 2.0, 500 + step);
        row[10] = row[20]; // a tie somewhere
        let exact = log_softmax_f64(&row);
        let scored = Logits::new(vec![0], row.len(), row.clone())
            .log_probs(0)
            .expect("finite");
        let s = sample(&row, &params, &mut state, 0).expect("finite");
        assert_eq!(s.top_logprobs.len(), 5);
        // Independent ranking: full sort by raw logit descending, ties to the lower id.
        let mut ids: Vec<usize> = (0..row.len()).collect();
        ids.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).expect("finite").then(a.cmp(&b)));
        for (k, &(id, lp)) in s.top_logprobs.iter().enumerate() {
            assert_eq!(id as usize, ids[k], "rank {k}");
            assert_eq!(lp.to_bits(), scored[id as usize].to_bits());
            assert!((lp as f64 - exact[id as usize]).abs() < 1e-5);
        }
        assert!(s.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
    }
}

#[test]
fn logprobs_ignore_the_processors() {
    // The same row with heavy processing vs none: same logprob for the same token.
    let row = synthetic_logits(100, 2.0, 3);
    let mut plain_state = SamplerState::new(0, &[]);
    let mut proc_state = SamplerState::new(0, &[1, 2]);
    let plain = SamplingParams {
        logprobs: true,
        top_logprobs: 4,
        ..SamplingParams::greedy()
    };
    let a = sample(&row, &plain, &mut plain_state, 0).expect("finite");
    let forced = SamplingParams {
        logit_bias: vec![(42, 100.0)],
        ..processed_params()
    };
    let b = sample(&row, &forced, &mut proc_state, 0).expect("finite");
    assert_eq!(b.token, 42, "a +100 bias forces the token");
    let logprob = b.logprob.expect("asked for");
    assert!((logprob as f64 - log_softmax_f64(&row)[42]).abs() < 1e-5);
    assert_eq!(a.top_logprobs, b.top_logprobs[..4].to_vec());
}

#[test]
fn no_alternatives_unless_asked() {
    let row = synthetic_logits(100, 2.0, 4);
    let mut state = SamplerState::new(0, &[]);
    let off = SamplingParams {
        logprobs: false,
        top_logprobs: 5,
        ..SamplingParams::default()
    };
    assert!(sample(&row, &off, &mut state, 0)
        .expect("ok")
        .top_logprobs
        .is_empty());
    let zero = SamplingParams {
        logprobs: true,
        top_logprobs: 0,
        ..SamplingParams::default()
    };
    assert!(sample(&row, &zero, &mut state, 0)
        .expect("ok")
        .top_logprobs
        .is_empty());
    let small = [0.5f32, 0.25];
    let all = SamplingParams {
        logprobs: true,
        top_logprobs: 20,
        ..SamplingParams::default()
    };
    let s = sample(&small, &all, &mut state, 0).expect("ok");
    assert_eq!(
        s.top_logprobs.iter().map(|t| t.0).collect::<Vec<_>>(),
        vec![0, 1]
    );
}

/// A request that does not ask for logprobs gets none, and the same tokens from the same
/// stream as one that does; its rows are checked all the same.
#[test]
fn no_logprob_unless_asked_and_the_same_tokens() {
    for base in [
        SamplingParams::default(),
        SamplingParams::greedy(),
        processed_params(),
    ] {
        let asked = SamplingParams {
            logprobs: true,
            ..base.clone()
        };
        let quiet = SamplingParams {
            logprobs: false,
            ..base
        };
        let mut a = SamplerState::new(9, &[3, 4, 5]);
        let mut q = SamplerState::new(9, &[3, 4, 5]);
        for step in 0..200 {
            let row = synthetic_logits(300, 3.0, 900 + step);
            let x = sample(&row, &asked, &mut a, step as usize).expect("finite");
            let y = sample(&row, &quiet, &mut q, step as usize).expect("finite");
            assert!(x.logprob.is_some(), "step {step}");
            assert_eq!((y.logprob, y.top_logprobs.len()), (None, 0), "step {step}");
            assert_eq!(x.token, y.token, "step {step}");
            a.append_output(x.token);
            q.append_output(y.token);
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut row = synthetic_logits(300, 3.0, 7);
            row[100] = bad;
            let e = sample(&row, &quiet, &mut q, 0).map(|_| ()).unwrap_err();
            assert_eq!(e, SamplerError::NonFiniteLogits);
        }
        let e = sample(&[], &quiet, &mut q, 0).map(|_| ()).unwrap_err();
        assert_eq!(e, SamplerError::EmptyLogits);
    }
}

//! Faulty rows and invalid parameters: errors, never panics, never effects on other rows.

mod sampler_reference;

use sampler_reference::synthetic_logits;
use tandem_engine::sampler::{sample, SamplerError, SamplerState, SamplingParams};

#[test]
fn nan_or_infinite_logits_give_an_error() {
    for params in [SamplingParams::default(), SamplingParams::greedy()] {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for pos in [0, 17, 49] {
                let mut row = synthetic_logits(50, 1.0, 1);
                row[pos] = bad;
                let mut state = SamplerState::new(0, &[]);
                let got = sample(&row, &params, &mut state, 0);
                assert_eq!(got, Err(SamplerError::NonFiniteLogits), "{bad} at {pos}");
            }
        }
    }
    let mut state = SamplerState::new(0, &[]);
    let all_nan = vec![f32::NAN; 8];
    assert_eq!(
        sample(&all_nan, &SamplingParams::default(), &mut state, 0),
        Err(SamplerError::NonFiniteLogits)
    );
    assert_eq!(
        sample(&[], &SamplingParams::default(), &mut state, 0),
        Err(SamplerError::EmptyLogits)
    );
}

#[test]
fn a_bad_row_does_not_affect_the_other_rows_of_the_batch() {
    // The same batch of 5 rows, once clean and once with row 2 poisoned: rows 0, 1, 3, 4
    // give identical tokens and logprobs, every step.
    let params = SamplingParams {
        logprobs: true,
        top_logprobs: 3,
        ..SamplingParams::default()
    };
    let mut clean: Vec<SamplerState> = (0..5).map(|i| SamplerState::new(i, &[])).collect();
    let mut dirty = clean.clone();
    for step in 0..50 {
        for r in 0..5usize {
            let row = synthetic_logits(50, 1.5, (step * 5 + r) as u64);
            let a = sample(&row, &params, &mut clean[r], step).expect("clean row");
            let mut poisoned = row.clone();
            if r == 2 {
                poisoned[step % 50] = f32::NAN;
            }
            let b = sample(&poisoned, &params, &mut dirty[r], step);
            if r == 2 {
                assert_eq!(b, Err(SamplerError::NonFiniteLogits));
            } else {
                assert_eq!(b, Ok(a));
            }
        }
    }
}

#[test]
fn extreme_but_valid_values_do_not_break_sampling() {
    let row = vec![f32::MAX, -f32::MAX, 0.0, f32::MIN_POSITIVE];
    let tiny = SamplingParams {
        temperature: 1e-30,
        repetition_penalty: 1e-30,
        top_p: 1e-7,
        logprobs: true,
        ..SamplingParams::default()
    };
    let huge = SamplingParams {
        temperature: f32::MAX,
        repetition_penalty: f32::MAX,
        logprobs: true,
        ..SamplingParams::default()
    };
    for p in [tiny, huge] {
        p.validate(4).expect("valid");
        let mut state = SamplerState::new(1, &[0, 1]);
        state.append_output(1);
        for i in 0..100 {
            let s = sample(&row, &p, &mut state, i).expect("finite row");
            assert!(s.token < 4);
            let logprob = s.logprob.expect("asked for");
            assert!(logprob.is_finite() || logprob == f32::NEG_INFINITY);
        }
    }
}

#[test]
fn suppressing_every_token_is_an_error_not_a_panic() {
    let params = SamplingParams {
        min_tokens: 3,
        stop_token_ids: vec![0, 1],
        eos_token_ids: vec![2],
        ..SamplingParams::default()
    };
    for p in [
        params.clone(),
        SamplingParams {
            temperature: 0.0,
            ..params.clone()
        },
    ] {
        let mut state = SamplerState::new(0, &[]);
        assert_eq!(
            sample(&[1.0, 2.0, 3.0], &p, &mut state, 0),
            Err(SamplerError::NoCandidates)
        );
        // Once min_tokens is reached nothing is suppressed.
        assert!(sample(&[1.0, 2.0, 3.0], &p, &mut state, 3).is_ok());
    }
}

#[test]
fn min_tokens_never_emits_a_stop_token_early() {
    // EOS is by far the most likely token; it must not appear before min_tokens.
    let params = SamplingParams {
        min_tokens: 5,
        eos_token_ids: vec![0],
        stop_token_ids: vec![1],
        ..SamplingParams::default()
    };
    let row = [10.0, 9.0, 0.0, 0.0];
    let mut state = SamplerState::new(9, &[]);
    for i in 0..5 {
        assert!(sample(&row, &params, &mut state, i).expect("ok").token >= 2);
    }
    assert_eq!(
        sample(
            &row,
            &SamplingParams {
                temperature: 0.0,
                ..params.clone()
            },
            &mut state,
            5
        )
        .expect("ok")
        .token,
        0
    );
    assert!(params.is_stop_token(0) && params.is_stop_token(1) && !params.is_stop_token(2));
    // ignore_eos: EOS is neither a stop token nor suppressed.
    let ignore = SamplingParams {
        ignore_eos: true,
        temperature: 0.0,
        ..params
    };
    assert!(!ignore.is_stop_token(0));
    assert_eq!(sample(&row, &ignore, &mut state, 0).expect("ok").token, 0);
}

/// The field an invalid parameter set is rejected for.
fn rejected_field(p: SamplingParams) -> &'static str {
    match p.validate(100) {
        Err(SamplerError::InvalidParam { field, reason }) => {
            assert!(!reason.is_empty());
            field
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn validation_names_the_field() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                temperature: -0.1,
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::INFINITY,
                ..d()
            },
            "temperature",
        ),
        (SamplingParams { top_p: 0.0, ..d() }, "top_p"),
        (SamplingParams { top_p: 1.01, ..d() }, "top_p"),
        (SamplingParams { top_p: -1.0, ..d() }, "top_p"),
        (SamplingParams { top_k: -2, ..d() }, "top_k"),
        (
            SamplingParams {
                min_p: -0.01,
                ..d()
            },
            "min_p",
        ),
        (SamplingParams { min_p: 1.5, ..d() }, "min_p"),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: f32::INFINITY,
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: 2.5,
                ..d()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: -2.5,
                ..d()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                logit_bias: vec![(100, 1.0)],
                ..d()
            },
            "logit_bias",
        ),
        (
            SamplingParams {
                logit_bias: vec![(5, 100.5)],
                ..d()
            },
            "logit_bias",
        ),
        (
            SamplingParams {
                logit_bias: vec![(5, f32::NAN)],
                ..d()
            },
            "logit_bias",
        ),
        (
            SamplingParams {
                top_logprobs: 21,
                ..d()
            },
            "top_logprobs",
        ),
        (
            SamplingParams {
                stop_token_ids: vec![100],
                ..d()
            },
            "stop_token_ids",
        ),
        (
            SamplingParams {
                eos_token_ids: vec![u32::MAX],
                ..d()
            },
            "eos_token_ids",
        ),
    ];
    for (p, field) in cases {
        assert_eq!(rejected_field(p), field);
    }
    let ok = [
        d(),
        SamplingParams::greedy(),
        SamplingParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 1.0,
            ..d()
        },
        SamplingParams {
            top_k: 1000,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            ..d()
        },
        SamplingParams {
            logit_bias: vec![(99, -100.0), (0, 100.0)],
            top_logprobs: 20,
            ..d()
        },
    ];
    for p in ok {
        assert_eq!(p.validate(100), Ok(()));
    }
}

#[test]
fn ids_outside_the_row_are_rejected_at_sampling_time_too() {
    let p = SamplingParams {
        logit_bias: vec![(10, 1.0)],
        ..SamplingParams::default()
    };
    let mut state = SamplerState::new(0, &[]);
    let got = sample(&[0.0; 4], &p, &mut state, 0);
    assert!(matches!(
        got,
        Err(SamplerError::InvalidParam {
            field: "logit_bias",
            ..
        })
    ));
}

//! `tandem plan --validate`: runs `tandem bench`'s measurement (B prompts of P random tokens
//! prefilled together, then G decode steps of all B; the fastest of three runs) over a grid
//! and sets the plan's predictions beside what was measured, with the error of each point.

use anyhow::Result;
use serde::Serialize;
use tandem_model::host_model::HostModel;

use super::calibrate::best_measure;
use super::cost::Roofline;
use super::PlanInputs;
use crate::args::ModelArgs;
use crate::bench_cmd::measure;
use crate::runner_setup::PreparedModel;

/// Tokens per prefill step, as `tandem bench` packs them by default.
const BENCH_STEP_TOKENS: usize = 8192;
/// Points whose prefill would take more tokens than this are left out (time bound).
const MAX_PREFILL_TOKENS: usize = 16384;

/// One grid point.
#[derive(Debug, Clone, Serialize)]
pub struct ValidationPoint {
    pub batch: usize,
    pub prompt_len: usize,
    pub gen_len: usize,
    pub prefill_predicted: f64,
    pub prefill_measured: f64,
    pub decode_predicted: f64,
    pub decode_measured: f64,
}

impl ValidationPoint {
    /// Relative errors (predicted - measured) / measured of prefill and decode tok/s.
    pub fn errors(&self) -> [f64; 2] {
        [
            self.prefill_predicted / self.prefill_measured - 1.0,
            self.decode_predicted / self.decode_measured - 1.0,
        ]
    }
}

/// Predicted vs measured over the grid.
#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    pub points: Vec<ValidationPoint>,
    /// Over every prefill and decode figure of the grid.
    pub median_abs_error: f64,
    pub max_abs_error: f64,
}

/// The grid: (batch, prompt length, gen length).
fn grid(quick: bool) -> Vec<(usize, usize, usize)> {
    let (batches, prompts, gen): (&[usize], &[usize], usize) = if quick {
        (&[1, 8], &[64, 512], 32)
    } else {
        (&[1, 4, 16, 32], &[64, 512, 2048, 4096], 64)
    };
    let mut out = Vec::new();
    for &b in batches {
        for &p in prompts {
            if b * p <= MAX_PREFILL_TOKENS {
                out.push((b, p, gen));
            }
        }
    }
    out
}

pub fn run(host: HostModel, args: &ModelArgs, i: &PlanInputs, quick: bool) -> Result<Validation> {
    let points = grid(quick);
    let block = i.block_size;
    let pool_blocks = points
        .iter()
        .map(|&(b, p, g)| b * (p + g).div_ceil(block))
        .max()
        .unwrap_or(1);
    let prepared = PreparedModel::new(host, args, Some(i.kv_dtype))?;
    let mut runner = prepared.into_runner(block, Some(pool_blocks))?;
    let r = Roofline {
        shape: &i.shape,
        hw: &i.hw,
        kv_dtype: i.kv_dtype,
    };
    let mut out = Vec::new();
    measure(runner.as_mut(), 1, 16, 4, BENCH_STEP_TOKENS)?; // first touch of pool and scratch
    for (b, p, g) in points {
        eprintln!("tandem: validate batch {b}, prompt {p}, gen {g}");
        let m = best_measure(runner.as_mut(), b, p, g)?;
        out.push(ValidationPoint {
            batch: b,
            prompt_len: p,
            gen_len: g,
            prefill_predicted: (b * p) as f64 / r.prefill(b, p, BENCH_STEP_TOKENS, (0, 0.0)),
            prefill_measured: (b * p) as f64 / m.prefill_s,
            decode_predicted: (b * g) as f64 / r.decode(b, p, g),
            decode_measured: (b * g) as f64 / m.decode_s,
        });
    }
    let mut errs: Vec<f64> = out.iter().flat_map(|p| p.errors()).map(f64::abs).collect();
    errs.sort_by(f64::total_cmp);
    let median_abs_error = match errs.len() {
        0 => 0.0,
        n if n % 2 == 1 => errs[n / 2],
        n => (errs[n / 2 - 1] + errs[n / 2]) / 2.0,
    };
    Ok(Validation {
        points: out,
        median_abs_error,
        max_abs_error: errs.last().copied().unwrap_or(0.0),
    })
}

impl Validation {
    /// The table for people.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::from(
            "\nvalidate  batch  prompt  gen  prefill tok/s pred / meas (err)  decode tok/s pred / meas (err)\n",
        );
        for p in &self.points {
            let [ep, ed] = p.errors();
            let _ = writeln!(
                o,
                "          {:>5}  {:>6}  {:>3}  {:>8.1} / {:>8.1} ({:>+5.1}%)  {:>8.1} / {:>8.1} ({:>+5.1}%)",
                p.batch, p.prompt_len, p.gen_len, p.prefill_predicted, p.prefill_measured,
                ep * 100.0, p.decode_predicted, p.decode_measured, ed * 100.0
            );
        }
        let _ = writeln!(
            o,
            "          median |error| {:.1}%, max {:.1}%",
            self.median_abs_error * 100.0,
            self.max_abs_error * 100.0
        );
        o
    }
}

//! Hand-built SVG charts of a plan (no script, no plotting crate): tokens/s and step latency
//! by batch size with the bandwidth- and compute-bound regions, the memory stack by context,
//! and predicted vs measured throughput after `--validate`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::report::Plan;

const W: f64 = 360.0;
const H: f64 = 240.0;
const MARGIN: (f64, f64, f64, f64) = (52.0, 14.0, 28.0, 40.0); // left, right, top, bottom
const COLORS: [&str; 3] = ["#1f77b4", "#d62728", "#2ca02c"];

/// Writes `throughput.svg`, `memory.svg` and, after `--validate`, `validate.svg`.
pub fn write_all(dir: &Path, plan: &Plan) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut files = vec![
        ("throughput.svg", throughput(plan)),
        ("memory.svg", memory(plan)),
    ];
    if plan.validation.is_some() {
        files.push(("validate.svg", validate(plan)));
    }
    for (name, svg) in files {
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| path.display().to_string())?;
        eprintln!("tandem: wrote {}", path.display());
    }
    Ok(())
}

/// A panel at `(x0, y0)` with log or linear axes over data ranges.
struct Panel {
    x0: f64,
    y0: f64,
    x: (f64, f64, bool),
    y: (f64, f64, bool),
}

impl Panel {
    fn scale(v: f64, (lo, hi, log): (f64, f64, bool), len: f64) -> f64 {
        let f = if log {
            (v.max(lo).ln() - lo.ln()) / (hi.ln() - lo.ln())
        } else {
            (v - lo) / (hi - lo)
        };
        f.clamp(0.0, 1.0) * len
    }
    fn px(&self, v: f64) -> f64 {
        self.x0 + MARGIN.0 + Self::scale(v, self.x, W - MARGIN.0 - MARGIN.1)
    }
    fn py(&self, v: f64) -> f64 {
        self.y0 + H - MARGIN.3 - Self::scale(v, self.y, H - MARGIN.2 - MARGIN.3)
    }

    /// Frame, title, axis labels and ticks.
    fn frame(
        &self,
        o: &mut String,
        title: &str,
        xlabel: &str,
        ylabel: &str,
        xt: &[f64],
        yt: &[f64],
    ) {
        let (l, r) = (self.px(self.x.0), self.px(self.x.1));
        let (b, t) = (self.py(self.y.0), self.py(self.y.1));
        let _ = write!(
            o,
            r##"<rect x="{l:.1}" y="{t:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#444"/>"##,
            r - l,
            b - t
        );
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{title}</text>"#,
            (l + r) / 2.0,
            self.y0 + 16.0
        );
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{xlabel}</text>"#,
            (l + r) / 2.0,
            self.y0 + H - 6.0
        );
        let _ = write!(
            o,
            r#"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{ylabel}</text>"#,
            self.x0 + 12.0,
            (t + b) / 2.0
        );
        for &v in xt {
            let _ = write!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{}</text>"#,
                self.px(v),
                b + 12.0,
                tick(v)
            );
        }
        for &v in yt {
            let _ = write!(
                o,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="9">{}</text><line x1="{l:.1}" x2="{r:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
                l - 3.0,
                self.py(v) + 3.0,
                tick(v),
                y = self.py(v)
            );
        }
    }

    fn line(&self, o: &mut String, pts: &[(f64, f64)], color: &str, dash: bool) {
        let d: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", self.px(x), self.py(y)))
            .collect();
        let dash = if dash {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = write!(
            o,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
            d.join(" ")
        );
        for &(x, y) in pts {
            let _ = write!(
                o,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                self.px(x),
                self.py(y)
            );
        }
    }

    /// A legend in the top left corner, or the bottom right one (`bottom_right`).
    fn legend(&self, o: &mut String, items: &[(&str, &str)], bottom_right: bool) {
        for (k, (name, color)) in items.iter().enumerate() {
            let (x, y) = if bottom_right {
                let rows_below = (items.len() - k) as f64;
                (
                    self.px(self.x.1) - 80.0,
                    self.py(self.y.0) - 8.0 - 13.0 * rows_below,
                )
            } else {
                (
                    self.px(self.x.0) + 8.0,
                    self.py(self.y.1) + 14.0 + 13.0 * k as f64,
                )
            };
            let _ = write!(
                o,
                r#"<rect x="{x:.1}" y="{:.1}" width="10" height="4" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="10">{name}</text>"#,
                y - 4.0,
                x + 14.0,
                y
            );
        }
    }
}

fn tick(v: f64) -> String {
    if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 10.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// 1, 2, 5 x 10^k ticks within `[lo, hi]`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut p = 10f64.powf(lo.max(1e-9).log10().floor());
    while p <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = m * p;
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
        p *= 10.0;
    }
    out
}

fn document(width: f64, height: f64, body: &str) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>{body}</svg>
"#
    )
}

/// Range of positive values, widened a little, for a log axis.
fn log_range(vals: impl Iterator<Item = f64>) -> (f64, f64, bool) {
    let (lo, hi) = vals.fold((f64::INFINITY, 0f64), |(l, h), v| (l.min(v), h.max(v)));
    (lo.max(1e-9) / 1.3, hi.max(lo * 2.0) * 1.3, true)
}

/// Tokens/s (decode, prefill) and decode step latency by batch size, the compute-bound
/// region shaded.
fn throughput(plan: &Plan) -> String {
    let mut o = String::new();
    let d = &plan.decode_by_batch;
    let p = &plan.prefill_by_batch;
    let bmax = d.last().map_or(2.0, |c| c.batch as f64).max(2.0);
    let x = (1.0, bmax, true);
    let rates = d
        .iter()
        .map(|c| c.tok_per_s)
        .chain(p.iter().map(|c| c.tok_per_s));
    let left = Panel {
        x0: 0.0,
        y0: 0.0,
        x,
        y: log_range(rates),
    };
    if let Some(b) = plan.crossover_batch.filter(|&b| (b as f64) <= bmax) {
        let (x1, x2) = (left.px(b as f64), left.px(bmax));
        let _ = write!(
            o,
            r##"<rect x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#fdebd0"/><text x="{:.1}" y="{:.1}" font-size="9" text-anchor="end">compute-bound</text>"##,
            left.py(left.y.1),
            x2 - x1,
            left.py(left.y.0) - left.py(left.y.1),
            x2 - 3.0,
            left.py(left.y.0) - 4.0
        );
    }
    let xt: Vec<f64> = d.iter().map(|c| c.batch as f64).collect();
    left.frame(
        &mut o,
        "tokens/s by batch",
        "batch (sequences per step)",
        "tokens/s",
        &xt,
        &ticks(left.y.0, left.y.1),
    );
    left.line(
        &mut o,
        &d.iter()
            .map(|c| (c.batch as f64, c.tok_per_s))
            .collect::<Vec<_>>(),
        COLORS[0],
        false,
    );
    left.line(
        &mut o,
        &p.iter()
            .map(|c| (c.batch as f64, c.tok_per_s))
            .collect::<Vec<_>>(),
        COLORS[1],
        false,
    );
    if let Some(rate) = &plan.rate {
        operating_point(&left, &mut o, rate);
    }
    left.legend(
        &mut o,
        &[("decode", COLORS[0]), ("prefill", COLORS[1])],
        true,
    );
    let right = Panel {
        x0: W,
        y0: 0.0,
        x,
        y: log_range(d.iter().map(|c| c.step_ms)),
    };
    right.frame(
        &mut o,
        "decode step latency",
        "batch (sequences per step)",
        "ms per step (ITL)",
        &xt,
        &ticks(right.y.0, right.y.1),
    );
    right.line(
        &mut o,
        &d.iter()
            .map(|c| (c.batch as f64, c.step_ms))
            .collect::<Vec<_>>(),
        COLORS[0],
        false,
    );
    let caption = format!(
        "{} on {}; context {} tokens; shaded: compute-bound (crossover at batch {})",
        plan.model,
        plan.hardware.name,
        plan.prompt_len + plan.gen_len / 2,
        plan.crossover_batch.map_or("-".into(), |b| b.to_string())
    );
    let _ = write!(
        o,
        r##"<text x="8" y="{:.1}" font-size="9" fill="#555">{}</text>"##,
        H + 12.0,
        escape(&caption)
    );
    document(2.0 * W, H + 18.0, &o)
}

/// With `--request-rate`: the output tokens/s at the decode batch of the steady state (or of
/// the saturation point when the rate is not sustainable), marked on the tokens/s panel.
fn operating_point(panel: &Panel, o: &mut String, rate: &super::rate::RateReport) {
    let (batch, tok_per_s, label) = match &rate.steady {
        Some(s) => (
            s.decode_batch,
            s.output_tok_per_s,
            super::rate::req_per_s(rate.request_rate),
        ),
        None => (
            rate.saturation.decode_batch,
            rate.saturation.output_tok_per_s,
            format!(
                "at most {}",
                super::rate::req_per_s(rate.saturation.request_rate)
            ),
        ),
    };
    let (x, y) = (panel.px(batch.max(1.0)), panel.py(tok_per_s));
    let _ = write!(
        o,
        r##"<circle cx="{x:.1}" cy="{y:.1}" r="4.5" fill="none" stroke="#000" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" font-size="9">{}</text>"##,
        x + 6.0,
        y - 6.0,
        escape(&label)
    );
}

/// Weights, KV cache and activations at the workload's concurrency, by context length.
fn memory(plan: &Plan) -> String {
    let mut o = String::new();
    let c = &plan.capacity;
    let weights = plan
        .shape
        .resident_weight_bytes(plan.hardware.bytes_per_weight())
        / 1e6;
    let s = &plan.shape;
    let tokens = plan.max_num_batched_tokens as f64;
    let activations = (tokens * (6 * s.hidden_size + 2 * s.kv_dim) as f64 * 4.0
        + plan.concurrency as f64 * s.vocab_size as f64 * 4.0)
        / 1e6;
    let contexts: Vec<usize> = [128, 512, 2048, 8192, 32768]
        .into_iter()
        .filter(|&x| x <= s.context_len)
        .collect();
    let kv = |ctx: usize| plan.concurrency as f64 * ctx as f64 * c.slot_bytes as f64 / 1e6;
    let budget = c.budget_bytes as f64 / 1e6;
    let top = contexts
        .iter()
        .map(|&x| weights + kv(x) + activations)
        .fold(weights + budget, f64::max);
    let panel = Panel {
        x0: 0.0,
        y0: 0.0,
        x: (0.0, contexts.len() as f64, false),
        y: (0.0, top * 1.1, false),
    };
    let yt: Vec<f64> = (0..=4).map(|k| top * 1.1 * k as f64 / 4.0).collect();
    panel.frame(
        &mut o,
        &format!("memory at {} requests", plan.concurrency),
        "context (tokens per request)",
        "MB",
        &[],
        &yt,
    );
    let bw = (panel.px(1.0) - panel.px(0.0)) * 0.6;
    for (k, &ctx) in contexts.iter().enumerate() {
        let mut base = 0.0;
        let xc = panel.px(k as f64 + 0.5);
        for (v, color) in [
            (weights, COLORS[0]),
            (kv(ctx), COLORS[1]),
            (activations, COLORS[2]),
        ] {
            let (y1, y2) = (panel.py(base + v), panel.py(base));
            let _ = write!(
                o,
                r#"<rect x="{:.1}" y="{y1:.1}" width="{bw:.1}" height="{:.1}" fill="{color}"/>"#,
                xc - bw / 2.0,
                (y2 - y1).max(0.5)
            );
            base += v;
        }
        let _ = write!(
            o,
            r#"<text x="{xc:.1}" y="{:.1}" text-anchor="middle" font-size="9">{ctx}</text>"#,
            panel.py(0.0) + 12.0
        );
    }
    let yb = panel.py(weights + budget);
    let _ = write!(
        o,
        r##"<line x1="{:.1}" x2="{:.1}" y1="{yb:.1}" y2="{yb:.1}" stroke="#000" stroke-dasharray="5 3"/><text x="{:.1}" y="{:.1}" font-size="9" text-anchor="end">weights + KV budget</text>"##,
        panel.px(0.0),
        panel.px(panel.x.1),
        panel.px(panel.x.1) - 3.0,
        yb - 3.0
    );
    panel.legend(
        &mut o,
        &[
            ("weights", COLORS[0]),
            ("KV cache", COLORS[1]),
            ("activations", COLORS[2]),
        ],
        false,
    );
    document(W, H, &o)
}

/// Predicted vs measured tok/s, log-log, with the ±15% band.
fn validate(plan: &Plan) -> String {
    let mut o = String::new();
    let Some(v) = &plan.validation else {
        return document(W, H, "");
    };
    let pts: Vec<(f64, f64, bool)> = v
        .points
        .iter()
        .flat_map(|p| {
            [
                (p.prefill_measured, p.prefill_predicted, true),
                (p.decode_measured, p.decode_predicted, false),
            ]
        })
        .collect();
    let r = log_range(pts.iter().flat_map(|p| [p.0, p.1]));
    let panel = Panel {
        x0: 0.0,
        y0: 0.0,
        x: r,
        y: r,
    };
    let t = ticks(r.0, r.1);
    panel.frame(
        &mut o,
        "predicted vs measured",
        "measured tok/s",
        "predicted tok/s",
        &t,
        &t,
    );
    for (f, dash) in [(1.0, false), (1.15, true), (1.0 / 1.15, true)] {
        panel.line(&mut o, &[(r.0, r.0 * f), (r.1, r.1 * f)], "#999", dash);
    }
    for &(m, p, prefill) in &pts {
        let color = if prefill { COLORS[1] } else { COLORS[0] };
        let _ = write!(
            o,
            r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#,
            panel.px(m),
            panel.py(p)
        );
    }
    panel.legend(
        &mut o,
        &[("decode", COLORS[0]), ("prefill", COLORS[1])],
        false,
    );
    document(W, H, &o)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

//! Hardware profiles: the ceilings of the roofline. A profile is either measured on this
//! machine by `tandem plan --calibrate` (saved as JSON) or one of the built-in datasheet
//! profiles of common GPUs, so that a GPU deployment can be planned from a laptop.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Which runner the profile describes: how weights and KV are stored and which rate a
/// matrix product runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// tandem's CPU runner: weights as stored (int8 kernels on quantized blocks).
    Cpu,
    /// tandem's CUDA runner: bf16 weights and KV cache, products on tensor cores.
    Gpu,
}

/// Matrix-product rate at a number of tokens per product (the kernels' efficiency grows
/// with the tokens that share each weight read).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatePoint {
    pub tokens: usize,
    /// FLOP/s.
    pub flops: f64,
}

/// One machine's ceilings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    pub name: String,
    pub kind: DeviceKind,
    /// How the profile came about (datasheet or calibration, and when).
    pub source: String,
    /// Threads the rates were measured with (CPU).
    pub threads: usize,
    /// Sustained read bandwidth of the memory weights and KV live in, bytes/s.
    pub bandwidth: f64,
    /// Matrix-product rate (CPU: the int8 kernels on quantized weights; GPU: bf16 tensor
    /// cores), by tokens per product, ascending; interpolated in log(tokens).
    pub matmul: Vec<RatePoint>,
    /// Attention rate of decode tokens (CPU: the f32 group kernel over f16 K/V), FLOP/s.
    pub attention_flops: f64,
    /// Attention rate of prefill chunks (CPU: the tile kernel, 16 rows per K/V pass), FLOP/s.
    pub prefill_attention_flops: f64,
    /// Fixed cost of one engine step (scheduling, sampling, the embedding and LM head
    /// rounds), s.
    pub step_overhead_s: f64,
    /// Fixed cost per layer of one step (thread-pool rounds or kernel launches), s.
    pub layer_overhead_s: f64,
    /// Memory for weights, KV and activations (GPU), bytes; 0 when not a limit.
    pub memory_bytes: f64,
}

impl HardwareProfile {
    /// The matrix-product rate at `tokens` tokens per product.
    pub fn matmul_flops(&self, tokens: f64) -> f64 {
        let pts = &self.matmul;
        let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
            return 1.0;
        };
        if tokens <= first.tokens as f64 {
            return first.flops;
        }
        if tokens >= last.tokens as f64 {
            return last.flops;
        }
        let at = pts.partition_point(|p| (p.tokens as f64) < tokens);
        let (a, b) = (pts[at - 1], pts[at]);
        let t = (tokens.ln() - (a.tokens as f64).ln())
            / ((b.tokens as f64).ln() - (a.tokens as f64).ln());
        a.flops + t * (b.flops - a.flops)
    }

    /// The fixed cost of one step of a model of `num_layers` layers.
    pub fn overhead_s(&self, num_layers: usize) -> f64 {
        self.step_overhead_s + self.layer_overhead_s * num_layers as f64
    }

    /// Bytes per stored weight on this device (`None`: as the model file stores them).
    pub fn bytes_per_weight(&self) -> Option<f64> {
        match self.kind {
            DeviceKind::Cpu => None,
            DeviceKind::Gpu => Some(2.0),
        }
    }

    /// Reads a saved profile, or names a built-in one.
    pub fn load(name_or_path: &str) -> Result<HardwareProfile> {
        if let Some(p) = builtin(name_or_path) {
            return Ok(p);
        }
        let path = Path::new(name_or_path);
        if !path.exists() {
            bail!(
                "--hardware {name_or_path}: neither a profile file nor a built-in profile ({})",
                BUILTIN_NAMES.join(", ")
            );
        }
        let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
        let p: HardwareProfile = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a hardware profile", path.display()))?;
        p.check()?;
        Ok(p)
    }

    /// Refuses profiles whose ceilings are not positive.
    pub fn check(&self) -> Result<()> {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        if !ok(self.bandwidth)
            || !ok(self.attention_flops)
            || !ok(self.prefill_attention_flops)
            || self.matmul.is_empty()
        {
            bail!(
                "profile {}: bandwidth, rates and matmul points must be positive",
                self.name
            );
        }
        if self.matmul.iter().any(|p| !ok(p.flops) || p.tokens == 0)
            || self.matmul.windows(2).any(|w| w[0].tokens >= w[1].tokens)
        {
            bail!(
                "profile {}: matmul points need ascending tokens and positive rates",
                self.name
            );
        }
        let fixed = [self.step_overhead_s, self.layer_overhead_s];
        if fixed.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            bail!("profile {}: the overheads must be >= 0", self.name);
        }
        Ok(())
    }
}

/// Names of the built-in profiles.
pub const BUILTIN_NAMES: [&str; 5] = ["h100", "h200", "a100", "l4", "rtx4090"];

/// A datasheet GPU profile: HBM/GDDR bandwidth, dense bf16 tensor rate (fp32 accumulate),
/// memory. Rates reached in practice are lower; the overheads (0.2 ms per step, 30 µs per
/// layer: a handful of kernel launches) are assumptions, not datasheet figures.
fn gpu(name: &str, bandwidth_tb: f64, bf16_tflops: f64, memory_gb: f64) -> HardwareProfile {
    let peak = bf16_tflops * 1e12;
    HardwareProfile {
        name: name.into(),
        kind: DeviceKind::Gpu,
        source: "datasheet (dense bf16, no sparsity)".into(),
        threads: 1,
        bandwidth: bandwidth_tb * 1e12,
        // Tensor cores fill their tiles from 64 tokens on; below, a product is bandwidth-bound
        // long before the arithmetic counts.
        matmul: vec![
            RatePoint {
                tokens: 1,
                flops: peak / 64.0,
            },
            RatePoint {
                tokens: 64,
                flops: peak,
            },
        ],
        attention_flops: peak / 4.0,
        prefill_attention_flops: peak / 4.0,
        step_overhead_s: 0.2e-3,
        layer_overhead_s: 30e-6,
        memory_bytes: memory_gb * 1e9,
    }
}

/// A built-in profile by name.
pub fn builtin(name: &str) -> Option<HardwareProfile> {
    match name.to_ascii_lowercase().as_str() {
        "h100" => Some(gpu("H100 SXM", 3.35, 989.0, 80.0)),
        "h200" => Some(gpu("H200 SXM", 4.8, 989.0, 141.0)),
        "a100" => Some(gpu("A100 80GB SXM", 2.039, 312.0, 80.0)),
        "l4" => Some(gpu("L4", 0.3, 121.0, 24.0)),
        "rtx4090" | "4090" => Some(gpu("RTX 4090", 1.008, 165.2, 24.0)),
        _ => None,
    }
}

/// The datasheet profile of a GPU the driver names `device_name` (`NVIDIA H100 80GB HBM3`,
/// `NVIDIA L4`, ...), with the memory it reports, and the built-in profile it matched;
/// `None`: a generic GPU profile whose rates are placeholders (1 TB/s, 100 TFLOP/s) for
/// `--calibrate` to replace.
pub fn for_gpu(device_name: &str, memory_bytes: f64) -> (HardwareProfile, Option<&'static str>) {
    let upper = device_name.to_ascii_uppercase();
    // Whole words only: an L40S is not an L4.
    let words: Vec<&str> = upper.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    let has = |w: &str| words.contains(&w);
    let matched = if has("H200") {
        Some("h200")
    } else if has("H100") {
        Some("h100")
    } else if has("A100") {
        Some("a100")
    } else if has("L4") {
        Some("l4")
    } else if has("4090") {
        Some("rtx4090")
    } else {
        None
    };
    let mut p = match matched.and_then(builtin) {
        Some(p) => p,
        None => {
            let mut p = gpu(device_name, 1.0, 100.0, 0.0);
            p.source = "generic GPU (no datasheet profile): placeholder rates".into();
            p
        }
    };
    if memory_bytes > 0.0 {
        p.memory_bytes = memory_bytes;
    }
    (p, matched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_interpolate_between_points_and_clamp_outside() {
        let p = builtin("h100").expect("built in");
        assert_eq!(p.matmul_flops(1.0), p.matmul[0].flops);
        assert_eq!(p.matmul_flops(1000.0), 989e12);
        let mid = p.matmul_flops(8.0); // halfway in log(tokens) between 1 and 64
        let want = (989e12 / 64.0 + 989e12) / 2.0;
        assert!((mid - want).abs() / want < 1e-9);
        for name in BUILTIN_NAMES {
            builtin(name).expect("listed").check().expect("valid");
        }
    }

    #[test]
    fn bad_profiles_are_refused() {
        let mut p = builtin("l4").expect("built in");
        p.bandwidth = 0.0;
        assert!(p.check().is_err());
        assert!(HardwareProfile::load("no-such-gpu").is_err());
    }

    #[test]
    fn gpus_are_matched_to_their_datasheet_profile_by_name() {
        let gb = 1e9;
        let cases = [
            ("NVIDIA H100 80GB HBM3", Some("h100")),
            ("NVIDIA H100 PCIe", Some("h100")),
            ("NVIDIA H200", Some("h200")),
            ("NVIDIA A100-SXM4-40GB", Some("a100")),
            ("NVIDIA L4", Some("l4")),
            ("NVIDIA GeForce RTX 4090", Some("rtx4090")),
            ("NVIDIA L40S", None),
            ("NVIDIA GH200 480GB", None),
            ("Tesla T4", None),
        ];
        for (name, want) in cases {
            let (p, matched) = for_gpu(name, 40.0 * gb);
            assert_eq!(matched, want, "{name}");
            assert_eq!(p.kind, DeviceKind::Gpu);
            // The memory is what the device reports, whatever the datasheet says.
            assert_eq!(p.memory_bytes, 40.0 * gb, "{name}");
            p.check().expect("a valid profile");
            match want {
                Some(b) => {
                    let datasheet = builtin(b).expect("built in");
                    assert_eq!(p.bandwidth, datasheet.bandwidth, "{name}");
                    assert_eq!(p.matmul, datasheet.matmul, "{name}");
                }
                None => {
                    assert_eq!(p.name, name);
                    assert!(p.source.contains("generic"), "{}", p.source);
                }
            }
        }
        // A device that reports no memory keeps the datasheet's.
        let (p, _) = for_gpu("NVIDIA H200", 0.0);
        assert_eq!(p.memory_bytes, 141.0 * gb);
    }
}

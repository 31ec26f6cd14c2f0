//! The mixture-of-experts fields of a Hugging Face `config.json` (Mixtral, Qwen3-MoE), read
//! as transformers' config classes define them.
//!
//! - the expert count: `num_local_experts` (Mixtral; Qwen3-MoE in transformers 5) or
//!   `num_experts` (Qwen3-MoE in 4.x and on the Hub), which must agree when both are given;
//! - `num_experts_per_tok`;
//! - the experts' width: `moe_intermediate_size` (Qwen3-MoE) or `intermediate_size` (Mixtral);
//! - the chosen weights renormalised: always for Mixtral, `norm_topk_prob` (default false)
//!   for Qwen3-MoE.
//!
//! Qwen3-MoE configs that make some layers dense (`decoder_sparse_step` other than 1, a
//! non-empty `mlp_only_layers`) are refused: no released model does, and tandem's layers
//! are all sparse.

use serde_json::{Map, Value};

use crate::config::{Architecture, MixtureOfExperts};
use crate::error::Result;
use crate::hf_config::{field_err, opt_bool, opt_usize, present, req_usize};

/// The experts of a mixture-of-experts architecture; `None` for the dense ones.
pub(crate) fn hf_experts(
    cfg: &Map<String, Value>,
    arch: Architecture,
) -> Result<Option<MixtureOfExperts>> {
    if !arch.is_moe() {
        return Ok(None);
    }
    let num_experts = match (
        opt_usize(cfg, "num_local_experts")?,
        opt_usize(cfg, "num_experts")?,
    ) {
        (Some(a), Some(b)) if a != b => {
            return Err(field_err(
                "num_experts",
                format!("({b}) disagrees with num_local_experts ({a})"),
            ))
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => return Err(field_err("num_local_experts", "is missing")),
    };
    let (expert_ffn, normalize_top_k) = match arch {
        Architecture::Qwen3Moe => {
            check_all_layers_sparse(cfg)?;
            (
                req_usize(cfg, "moe_intermediate_size")?,
                opt_bool(cfg, "norm_topk_prob")?.unwrap_or(false),
            )
        }
        _ => (req_usize(cfg, "intermediate_size")?, true),
    };
    Ok(Some(MixtureOfExperts {
        num_experts,
        experts_per_token: req_usize(cfg, "num_experts_per_tok")?,
        expert_ffn,
        normalize_top_k,
    }))
}

/// Refuses a Qwen3-MoE config with dense layers.
fn check_all_layers_sparse(cfg: &Map<String, Value>) -> Result<()> {
    if let Some(step) = opt_usize(cfg, "decoder_sparse_step")?.filter(|&s| s != 1) {
        return Err(field_err(
            "decoder_sparse_step",
            format!("= {step} (dense layers between sparse ones) is not supported (1)"),
        ));
    }
    match present(cfg, "mlp_only_layers") {
        None => Ok(()),
        Some(Value::Array(layers)) if layers.is_empty() => Ok(()),
        Some(v) => Err(field_err(
            "mlp_only_layers",
            format!("= {v} (dense layers) is not supported (an empty list)"),
        )),
    }
}

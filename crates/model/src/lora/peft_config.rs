//! `adapter_config.json`: what tandem reads, what it ignores, and what it refuses.
//!
//! Read: `r`, `lora_alpha` (PEFT's default 8), `use_rslora`, `rank_pattern` and
//! `alpha_pattern` (PEFT's rule: key `k` applies to a module whose name matches
//! `^(.*\.)?(k)$`, the first such key winning), and which modules the adapter targets
//! (`target_modules`: names matched as the module's name or its last components, a regex
//! matched against the whole name, or `all-linear`; `layers_to_transform`;
//! `exclude_modules`). Ignored, as they change nothing at inference: provenance
//! (`base_model_name_or_path`, `revision`, `peft_version`, ...), `lora_dropout`, and
//! training-only settings. Any other key must be off (null, false, empty): a setting tandem
//! does not know might change the computation, so it is refused by name rather than
//! ignored. So are DoRA, biases, `fan_in_fan_out`, `modules_to_save`, and initialisations
//! that leave part of the adapter in a residual base model (PiSSA, OLoRA, CorDA, LoftQ).

use std::path::Path;

use regex::{Regex, RegexBuilder};
use serde_json::{Map, Value};

use super::MAX_RANK;

const CONFIG_FILE: &str = "adapter_config.json";
/// Largest `adapter_config.json` read, in bytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// PEFT's default `lora_alpha`.
const DEFAULT_ALPHA: f64 = 8.0;
/// The largest scale (`alpha / r`) accepted: trained adapters use 1/512 to 512, and a scale
/// past 2^16 would turn activations into infinities.
const MAX_SCALE: f64 = 65536.0;

/// Keys read below.
const READ: [&str; 13] = [
    "peft_type",
    "r",
    "lora_alpha",
    "use_rslora",
    "rank_pattern",
    "alpha_pattern",
    "target_modules",
    "layers_to_transform",
    "exclude_modules",
    "bias",
    "init_lora_weights",
    "modules_to_save",
    "loftq_config",
];
/// Keys that change nothing at inference.
const IGNORED: [&str; 11] = [
    "auto_mapping",
    "base_model_name_or_path",
    "revision",
    "peft_version",
    "task_type",
    "inference_mode",
    "lora_dropout",
    "layers_pattern",
    "megatron_core",
    "qalora_group_size",
    "ensure_weight_tying",
];

/// Which modules an adapter targets.
#[derive(Debug)]
enum Modules {
    /// A module whose name is one of these or ends with `.` and one of these.
    Names(Vec<String>),
    /// A module whose whole name matches.
    Pattern(Regex),
    /// PEFT's `all-linear`.
    AllLinear,
}

impl Modules {
    fn read(v: &Value, key: &str) -> Result<Modules, String> {
        match v {
            Value::String(s) if s == "all-linear" => Ok(Modules::AllLinear),
            Value::String(s) => whole_match(s).map(Modules::Pattern),
            Value::Array(items) => (items.iter())
                .map(|n| n.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Modules::Names)
                .ok_or(format!("`{key}` must list names")),
            other => Err(format!(
                "`{key}` must be a list of names or a regex, not {other}"
            )),
        }
    }

    fn contains(&self, module: &str) -> bool {
        match self {
            Modules::Names(names) => names
                .iter()
                .any(|n| module == n || module.ends_with(&format!(".{n}"))),
            Modules::Pattern(re) => re.is_match(module),
            Modules::AllLinear => true,
        }
    }
}

/// A regex that must match a whole name (Python's `re.fullmatch`). The pattern must be a
/// regex on its own (so that `a)|(b` cannot break out of the anchors), of bounded size.
fn whole_match(pattern: &str) -> Result<Regex, String> {
    let build = |p: &str| {
        RegexBuilder::new(p)
            .size_limit(MAX_REGEX_BYTES)
            .build()
            .map_err(|e| format!("regex {pattern:?}: {e}"))
    };
    build(pattern)?;
    build(&format!("^(?:{pattern})$"))
}

/// The most memory one compiled pattern may take, and the most pattern keys a config may
/// hold.
const MAX_REGEX_BYTES: usize = 1 << 20;
const MAX_PATTERN_KEYS: usize = 1024;

/// The settings of an adapter that tandem applies.
#[derive(Debug)]
pub(super) struct PeftConfig {
    r: usize,
    alpha: f64,
    rslora: bool,
    rank_pattern: Vec<(Regex, usize)>,
    alpha_pattern: Vec<(Regex, f64)>,
    targets: Modules,
    layers: Option<Vec<u64>>,
    exclude: Option<Modules>,
}

impl PeftConfig {
    /// Reads `adapter_config.json` in `dir`.
    pub(super) fn read(dir: &Path) -> Result<PeftConfig, String> {
        let path = dir.join(CONFIG_FILE);
        let size = std::fs::metadata(&path)
            .map_err(|e| format!("{CONFIG_FILE}: {e}"))?
            .len();
        if size > MAX_CONFIG_BYTES {
            return Err(format!(
                "{CONFIG_FILE} is {size} bytes (at most {MAX_CONFIG_BYTES})"
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{CONFIG_FILE}: {e}"))?;
        let cfg: Map<String, Value> =
            serde_json::from_str(&text).map_err(|e| format!("{CONFIG_FILE}: {e}"))?;
        check_unsupported(&cfg)?;
        let r = cfg
            .get("r")
            .and_then(Value::as_u64)
            .ok_or("`r` must be a positive integer")?;
        if r == 0 || r > MAX_RANK as u64 {
            return Err(format!("`r` = {r} is outside 1..={MAX_RANK}"));
        }
        let number = |v: &Value| v.as_f64().filter(|x| x.is_finite());
        Ok(PeftConfig {
            r: r as usize,
            alpha: match cfg.get("lora_alpha") {
                None | Some(Value::Null) => DEFAULT_ALPHA,
                Some(v) => number(v).ok_or("`lora_alpha` must be a number")?,
            },
            rslora: match cfg.get("use_rslora") {
                None | Some(Value::Null) => false,
                Some(v) => v.as_bool().ok_or("`use_rslora` must be true or false")?,
            },
            rank_pattern: pattern(&cfg, "rank_pattern", |v| v.as_u64().map(|r| r as usize))?,
            alpha_pattern: pattern(&cfg, "alpha_pattern", number)?,
            targets: Modules::read(
                cfg.get("target_modules").unwrap_or(&Value::Null),
                "target_modules",
            )?,
            layers: layers(cfg.get("layers_to_transform"))?,
            exclude: match cfg.get("exclude_modules") {
                None | Some(Value::Null) => None,
                Some(v) => Some(Modules::read(v, "exclude_modules")?),
            },
        })
    }

    /// Whether the adapter targets `module` (its name in the model, such as
    /// `model.layers.3.self_attn.q_proj`) of layer `layer`.
    /// As PEFT: `layers_to_transform` (when not empty) applies to a list of names, to the
    /// modules not named in full.
    pub(super) fn targets(&self, module: &str, layer: usize) -> bool {
        let named_in_full = match &self.targets {
            Modules::Names(names) => names.iter().any(|n| n == module),
            _ => true,
        };
        let in_layers = match &self.layers {
            Some(ls) if !ls.is_empty() && !named_in_full => ls.contains(&(layer as u64)),
            _ => true,
        };
        self.targets.contains(module)
            && in_layers
            && self.exclude.as_ref().is_none_or(|ex| !ex.contains(module))
    }

    /// The scale of `module`, whose `A` has `rank` rows: `alpha / r`, or `alpha / √r` with
    /// rsLoRA, each from its pattern when one matches.
    pub(super) fn scale(&self, module: &str, rank: usize) -> Result<f32, String> {
        let r = (self.rank_pattern.iter())
            .find(|(k, _)| k.is_match(module))
            .map_or(self.r, |e| e.1);
        if r != rank {
            return Err(format!("`{module}` has rank {rank}, the config says {r}"));
        }
        let alpha = (self.alpha_pattern.iter())
            .find(|(k, _)| k.is_match(module))
            .map_or(self.alpha, |e| e.1);
        let denominator = if self.rslora {
            (r as f64).sqrt()
        } else {
            r as f64
        };
        let scale = alpha / denominator;
        if scale.is_nan() || scale.abs() > MAX_SCALE {
            return Err(format!(
                "`{module}`: alpha {alpha} / {denominator} is not a scale in -{MAX_SCALE}..={MAX_SCALE}"
            ));
        }
        Ok(scale as f32)
    }
}

/// Refuses the settings that change the computation in ways tandem does not implement.
fn check_unsupported(cfg: &Map<String, Value>) -> Result<(), String> {
    if let Some(kind) = cfg.get("peft_type").and_then(Value::as_str) {
        if kind != "LORA" {
            return Err(format!(
                "`peft_type` is {kind}; only LORA adapters are supported"
            ));
        }
    }
    if cfg
        .get("bias")
        .and_then(Value::as_str)
        .is_some_and(|b| b != "none")
    {
        return Err("`bias` other than \"none\" is not supported".into());
    }
    if let Some(init) = cfg.get("init_lora_weights").and_then(Value::as_str) {
        let residual = ["pissa", "olora", "corda", "loftq", "lora_ga"];
        if residual
            .iter()
            .any(|r| init.to_ascii_lowercase().starts_with(r))
        {
            return Err(format!(
                "`init_lora_weights` = {init:?}: such an adapter needs its residual base model"
            ));
        }
    }
    for key in ["modules_to_save", "loftq_config"] {
        if !is_off(cfg.get(key)) {
            return Err(format!("`{key}` is set, which is not supported"));
        }
    }
    for (key, value) in cfg {
        let known = READ.contains(&key.as_str()) || IGNORED.contains(&key.as_str());
        if !known && !is_off(Some(value)) {
            return Err(format!(
                "`{key}` is set ({value:.60}), which tandem does not implement"
            ));
        }
    }
    Ok(())
}

/// Absent, null, false, or an empty list, object or string.
fn is_off(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null | Value::Bool(false)) => true,
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    }
}

/// `rank_pattern` or `alpha_pattern`: (PEFT's `^(.*\.)?(key)$`, value) in the file's order.
fn pattern<T>(
    cfg: &Map<String, Value>,
    key: &str,
    value: impl Fn(&Value) -> Option<T>,
) -> Result<Vec<(Regex, T)>, String> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) if map.len() > MAX_PATTERN_KEYS => Err(format!(
            "`{key}` has {} keys (at most {MAX_PATTERN_KEYS})",
            map.len()
        )),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                let v = value(v).ok_or(format!("`{key}.{k}` is {v}"))?;
                Ok((whole_match(&format!("(?:.*\\.)?(?:{k})"))?, v))
            })
            .collect(),
        Some(v) => Err(format!("`{key}` must be an object, not {v}")),
    }
}

/// `layers_to_transform`: one layer or a list.
fn layers(v: Option<&Value>) -> Result<Option<Vec<u64>>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(|l| Some(vec![l]))
            .ok_or("`layers_to_transform` must be layer indices".into()),
        Some(Value::Array(items)) => (items.iter())
            .map(Value::as_u64)
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or("`layers_to_transform` must be layer indices".into()),
        Some(v) => Err(format!(
            "`layers_to_transform` must be layer indices, not {v}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_keys_match_as_peft_matches_them() {
        let re = whole_match("(?:.*\\.)?(?:(q|v)_proj)").expect("regex");
        assert!(re.is_match("model.layers.0.self_attn.q_proj"));
        assert!(re.is_match("v_proj"));
        assert!(!re.is_match("model.layers.0.self_attn.k_proj"));
        assert!(!re.is_match("model.layers.0.self_attn.xq_proj"));
    }

    #[test]
    fn a_pattern_cannot_break_out_of_its_anchors() {
        assert!(whole_match("q)|(k").is_err());
        assert!(whole_match("a{1000}{1000}").is_err(), "too large");
    }

    #[test]
    fn target_names_match_whole_components() {
        let m = Modules::Names(vec!["q_proj".into(), "layers.1.mlp.up_proj".into()]);
        assert!(m.contains("model.layers.0.self_attn.q_proj"));
        assert!(m.contains("model.layers.1.mlp.up_proj"));
        assert!(!m.contains("model.layers.0.mlp.up_proj"));
        assert!(!m.contains("model.layers.0.self_attn.xq_proj"));
    }
}

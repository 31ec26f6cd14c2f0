//! The one place that turns a loaded model into a model runner with its KV pool: every
//! subcommand (score, generate, chat, serve, bench) and the draft model of speculative
//! decoding come through here.

use anyhow::{bail, Result};
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::host_model::HostModel;
use tandem_model::kv_store::{KvDtype, KvStore};
use tandem_model::runner::ModelRunner;
use tandem_model::transformer::Model;

/// A model prepared for its device whose KV pool is not yet sized: preparing first tells
/// what one token of KV costs, so that one memory budget can be split between a target
/// and a draft model.
#[derive(Debug)]
pub struct PreparedModel {
    model: Model,
    kv_dtype: KvDtype,
}

impl PreparedModel {
    /// Prepares `host` for the CPU on `threads` threads; keys and values as `kv_dtype`, else
    /// the model's default.
    pub fn cpu(host: HostModel, threads: usize, kv_dtype: Option<KvDtype>) -> PreparedModel {
        let model = Model::new(host, threads);
        let kv_dtype = kv_dtype.unwrap_or_else(|| model.default_kv_dtype());
        PreparedModel { model, kv_dtype }
    }

    /// Bytes one token slot of this model's KV pool takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        KvStore::bytes_per_token(&self.model.config, self.kv_dtype)
    }

    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// Bytes of the model's weights.
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// The runner with a pool of `num_blocks` blocks of `block_size` slots.
    pub fn into_runner(self, block_size: usize, num_blocks: usize) -> Result<Box<dyn ModelRunner>> {
        if num_blocks == 0 {
            bail!("the KV pool must hold at least one block");
        }
        let spec = KvSpec {
            block_size,
            num_blocks,
            dtype: Some(self.kv_dtype),
        };
        Ok(Box::new(CpuRunner::new(self.model, spec)?))
    }
}

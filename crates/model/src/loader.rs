//! Opens a model from a GGUF file or a Hugging Face directory: weights, config, tokenizer,
//! chat template and end-of-sequence ids.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::batch::TokenId;
use crate::chat_template::builtin_template;
use crate::error::{ModelError, Result};
use crate::gguf::{check_no_gaps, GgufFile, Metadata};
use crate::gguf_config::{config_from_gguf, linear_rope_factor};
use crate::hf_config::load_hf_config;
use crate::host_model::HostModel;
use crate::model_builder::{build_host_model, NameScheme};
use crate::safetensors::load_safetensors_dir;
use crate::tensor_check::{check_dtype, Role};
use crate::tokenizer::{GgufVocab, Tokenizer};

/// The file format a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    HuggingFace,
}

/// A loaded model, with everything needed to turn text into tokens and back. A runner
/// (`CpuRunner`, `CudaRunner`) prepares `host` for its device.
#[derive(Debug)]
pub struct LoadedModel {
    pub host: HostModel,
    pub tokenizer: Tokenizer,
    /// Tokens that end generation (metadata and generation_config).
    pub eos_token_ids: Vec<TokenId>,
    pub chat_template: Option<String>,
    /// The resolved path of the file or directory loaded.
    pub path: PathBuf,
    pub format: ModelFormat,
}

/// A loaded model but its weights: what [`load_model_beside`] returns with the weights'
/// preparation.
#[derive(Debug)]
pub struct ModelText {
    pub tokenizer: Tokenizer,
    /// Tokens that end generation (metadata and generation_config).
    pub eos_token_ids: Vec<TokenId>,
    pub chat_template: Option<String>,
    /// The resolved path of the file or directory loaded.
    pub path: PathBuf,
    pub format: ModelFormat,
}

/// Loads the model at `path` (a `.gguf` file or a directory with `config.json`).
pub fn load_model(path: &Path) -> Result<LoadedModel> {
    let (text, host) = load_model_beside(path, |host| host)?;
    Ok(LoadedModel {
        host,
        tokenizer: text.tokenizer,
        eos_token_ids: text.eos_token_ids,
        chat_template: text.chat_template,
        path: text.path,
        format: text.format,
    })
}

/// Loads the model at `path` and hands its weights to `prepare` (a runner packing them for
/// its device) while the tokenizer is built on another thread: with a large vocabulary the
/// tokenizer takes longer than the weights take to map (Gemma 3's 262,144 pieces: most of
/// a load), so the two overlap instead of adding up.
pub fn load_model_beside<R>(
    path: &Path,
    prepare: impl FnOnce(HostModel) -> R,
) -> Result<(ModelText, R)> {
    let path = path.canonicalize().map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (host, source, format) = if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(ModelError::NotAModel(format!(
                "{} is a directory without config.json (expected a Hugging Face model directory)",
                path.display()
            )));
        }
        let info = load_hf_config(&path)?;
        let tensors = load_safetensors_dir(&path)?;
        let host = build_host_model(info.config, tensors, NameScheme::HuggingFace, None)?;
        let source = TokenizerSource::HfDir(&path, info.eos_token_ids);
        (host, source, ModelFormat::HuggingFace)
    } else if has_gguf_magic(&path)? {
        let (host, md) = load_gguf_model(&path)?;
        let source = TokenizerSource::Gguf(GgufVocab::from_metadata(&md)?);
        (host, source, ModelFormat::Gguf)
    } else {
        return Err(ModelError::NotAModel(format!(
            "{} is neither a GGUF file (no GGUF magic) nor a Hugging Face model directory",
            path.display()
        )));
    };
    let (vocab_size, architecture) = (host.config.vocab_size, host.config.architecture);
    let (tokenizer, prepared) = std::thread::scope(|s| {
        // (The main thread's stack size: a builder thread's default is a quarter of it.)
        let tokenizer = std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn_scoped(s, || source.build())
            .map_err(|e| ModelError::Tokenizer(format!("starting the tokenizer's thread: {e}")));
        let prepared = prepare(host);
        let tokenizer = match tokenizer {
            Ok(t) => t.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
            Err(e) => Err(e),
        };
        (tokenizer, prepared)
    });
    // The tokenizer's build freed many small temporaries, on several threads: give their
    // pages back rather than keep them resident while serving.
    tandem_kernels::heap::release_free_memory();
    let (mut tokenizer, eos) = tokenizer?;
    // A GGUF vocabulary lists the embedding's rows: it may not hold more tokens.
    if format == ModelFormat::Gguf && tokenizer.vocab_size() > vocab_size {
        return Err(ModelError::Tokenizer(format!(
            "the tokenizer has {} tokens but the embedding only {vocab_size} rows",
            tokenizer.vocab_size(),
        )));
    }
    // Rows past the vocabulary (a padded embedding) are tokens of no text.
    tokenizer.pad_to(vocab_size);
    let chat_template = match format {
        ModelFormat::Gguf => tokenizer
            .chat_template()
            .or_else(|| builtin_template(architecture)),
        ModelFormat::HuggingFace => tokenizer.chat_template(),
    }
    .map(str::to_string);
    let text = ModelText {
        tokenizer,
        eos_token_ids: eos.into_iter().map(TokenId).collect(),
        chat_template,
        path,
        format,
    };
    Ok((text, prepared))
}

/// Where a model's tokenizer comes from.
enum TokenizerSource<'a> {
    Gguf(GgufVocab),
    /// The directory, and the end-of-generation ids of its config.
    HfDir(&'a Path, Vec<u32>),
}

impl TokenizerSource<'_> {
    /// The tokenizer and the ids that end generation.
    fn build(self) -> Result<(Tokenizer, Vec<u32>)> {
        match self {
            TokenizerSource::Gguf(vocab) => {
                let tokenizer = Tokenizer::from_gguf_vocab(&vocab)?;
                let eos = tokenizer.eos_ids();
                Ok((tokenizer, eos))
            }
            TokenizerSource::HfDir(dir, mut eos) => {
                let tokenizer = Tokenizer::from_hf_dir(dir)?;
                for id in tokenizer.eos_ids() {
                    if !eos.contains(&id) {
                        eos.push(id);
                    }
                }
                Ok((tokenizer, eos))
            }
        }
    }
}

fn has_gguf_magic(path: &Path) -> Result<bool> {
    let io_err = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(io_err)?;
    match f.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == b"GGUF"),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(io_err(e)),
    }
}

/// Loads only the weights and config of a GGUF model (no tokenizer), with its metadata.
/// Strict: the data section must hold exactly the tensors' bytes, and every tensor must be
/// one the architecture uses, of the right type class and shape (see `tensor_check.rs`).
pub fn load_gguf_model(path: &Path) -> Result<(HostModel, Metadata)> {
    let mut file = GgufFile::open(path)?;
    let data_len = file.file().bytes().len().saturating_sub(file.data_offset);
    check_no_gaps(&file.tensors, file.alignment, data_len)?;
    let md = std::mem::take(&mut file.metadata);
    let tensors = file.into_tensor_set()?;
    let embed = tensors.require("token_embd.weight")?;
    let vocab_size = embed.shape.first().copied().unwrap_or(0);
    let config = config_from_gguf(&md, vocab_size)?;
    let mut factors = match tensors.get("rope_freqs.weight") {
        Some(t) => {
            check_dtype(NameScheme::Gguf, Role::Vector, t.name, t.dtype)?;
            if t.shape != [config.head_dim / 2] {
                return Err(ModelError::BadTensor {
                    name: t.name.to_string(),
                    reason: format!(
                        "shape {:?}, expected [{}] (head_dim / 2)",
                        t.shape,
                        config.head_dim / 2
                    ),
                });
            }
            Some(t.to_f32()?)
        }
        None => None,
    };
    if let Some(f) = linear_rope_factor(&md)? {
        let half = config.head_dim / 2;
        let base = factors.take().unwrap_or_else(|| vec![1.0; half]);
        factors = Some(base.into_iter().map(|v| v * f).collect());
    }
    let host = build_host_model(config, tensors, NameScheme::Gguf, factors.as_deref())?;
    Ok((host, md))
}

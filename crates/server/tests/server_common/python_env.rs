//! A private Python environment with the pinned `openai` client, for the tests that drive
//! the server with it. Created on first use under the cargo target directory, reused
//! afterwards; nothing is installed into the system's Python.
//!
//! `python3 -m pip install --target` puts the client and its dependencies in a directory of
//! their own, which the driver script then finds through `PYTHONPATH` (no `venv` module
//! needed, and no clash with a system Python that refuses direct installs). Concurrent
//! creators are safe: each process installs into a scratch directory of its own and renames
//! it into place; the rename is atomic, the first one wins and the others drop their copy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `openai` release the tests are written against.
pub const OPENAI_VERSION: &str = "3.57.0";
/// The `jsonschema` release the structured-output checks validate with (installed beside
/// the client; `pydantic` comes with `openai`).
pub const JSONSCHEMA_VERSION: &str = "4.26.0";

/// The directory holding the pinned `openai` package and its dependencies, to put on
/// `PYTHONPATH`; installs it on first use. Panics with instructions when Python 3, pip or
/// the package index is unavailable.
pub fn openai_site_dir() -> &'static Path {
    // One creator per test process; other processes are handled by the atomic rename.
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = root.join(format!(
            "py-openai-{OPENAI_VERSION}-jsonschema-{JSONSCHEMA_VERSION}"
        ));
        if !dir.join("openai").is_dir() || !dir.join("jsonschema").is_dir() {
            install(root, &dir);
        }
        dir
    })
}

fn install(root: &Path, dir: &Path) {
    check_python();
    std::fs::create_dir_all(root).unwrap_or_else(|e| panic!("creating {}: {e}", root.display()));
    let scratch = root.join(format!(
        ".py-openai-{OPENAI_VERSION}.partial-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!(
        "tests: installing openai=={OPENAI_VERSION} for the server tests into {} (first use only)",
        dir.display()
    );
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "--target",
        ])
        .arg(&scratch)
        .arg(format!("openai=={OPENAI_VERSION}"))
        .arg(format!("jsonschema=={JSONSCHEMA_VERSION}"))
        .output()
        .expect("python3 runs");
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&scratch);
        panic!(
            "could not install openai=={OPENAI_VERSION} for the server tests ({}):\n{}\n\
             To provide it by hand: `python3 -m pip install --target {} openai=={OPENAI_VERSION}`",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            dir.display()
        );
    }
    // Fails when another process renamed its copy into place first; theirs is as good.
    if std::fs::rename(&scratch, dir).is_err() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    assert!(
        dir.join("openai").is_dir(),
        "{} has no openai package after installing it",
        dir.display()
    );
}

/// Panics with a clear message when `python3` or its pip is missing.
fn check_python() {
    let pip = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .unwrap_or_else(|e| {
            panic!("the server tests need Python 3 with pip (`python3` on PATH): {e}")
        });
    assert!(
        pip.status.success(),
        "the server tests need pip for python3 (`python3 -m pip --version` failed):\n{}",
        String::from_utf8_lossy(&pip.stderr)
    );
}

/// Runs the driver script `tests/py/NAME` against the server at `addr` (`--base-url`,
/// `--model`, `--openai-version`, then `extra`) with the pinned client on `PYTHONPATH`;
/// panics when it fails and returns its stdout. Exit status 3 means the pinned `openai`
/// package could not be imported.
pub fn run_script(addr: std::net::SocketAddr, name: &str, model: &str, extra: &[&str]) -> String {
    let site = openai_site_dir();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name);
    let out = Command::new("python3")
        .arg(&script)
        .arg("--base-url")
        .arg(format!("http://{addr}/v1"))
        .args(["--model", model, "--openai-version", OPENAI_VERSION])
        .args(extra)
        .env("PYTHONPATH", site)
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ne!(
        out.status.code(),
        Some(3),
        "the pinned `openai` package is not importable from {}\n{stderr}",
        site.display()
    );
    assert!(out.status.success(), "{name} failed:\n{stdout}\n{stderr}");
    stdout.into_owned()
}

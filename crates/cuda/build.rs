//! With the `emulator` feature (the crate's tests), compiles the kernel program as C++ for
//! the CPU: `emulator/` supplies the CUDA built-ins and a fiber per CUDA thread. Without it
//! the build script does nothing; the GPU program is compiled by NVRTC at run time.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The two numeric modes of the program (`act_t`): suffix and value of TANDEM_ACT_BF16.
const MODES: [(&str, u8); 2] = [("f32", 0), ("bf16", 1)];
/// Must equal `kernels::ATTN_PARTITION`; the emulator reports it and the Rust side checks.
const ATTN_PARTITION: usize = 128;
/// Bytes of dynamic shared memory a block may take: the most an H100 or H200 block may opt
/// in to (227 KiB).
const DYNAMIC_SHARED: usize = 232_448;

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=emulator");
    println!("cargo:rerun-if-changed=src/kernels.rs");
    if std::env::var_os("CARGO_FEATURE_EMULATOR").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let program = program_text(&manifest);
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .include(manifest.join("emulator"))
        .flag("-ffp-contract=off")
        // A vector load or store (uint4, float4, ...) at an address its type's alignment
        // does not divide faults on a GPU ("misaligned address", and the context is lost)
        // but not on x86: trap on it here too, so that the emulated tests catch it.
        .flag_if_supported("-fsanitize=alignment")
        .flag_if_supported("-fsanitize-undefined-trap-on-error")
        .flag_if_supported("-Wno-unknown-pragmas")
        .flag_if_supported("-Wno-unused-parameter")
        .file(manifest.join("emulator/runtime.cpp"))
        .file(manifest.join("emulator/fiber.cpp"));
    for (suffix, bf16) in MODES {
        let path = out.join(format!("kernels_{suffix}.cpp"));
        std::fs::write(&path, translation_unit(&program, suffix, bf16))
            .expect("writing the emulated program");
        build.file(path);
    }
    build.compile("tandem_cuda_emulator");
}

/// The kernel files concatenated as NVRTC sees them: in the order `src/kernels.rs` lists
/// them in `SOURCES` (a file may use what an earlier one defines).
fn program_text(manifest: &Path) -> String {
    let listing = std::fs::read_to_string(manifest.join("src/kernels.rs")).expect("kernels.rs");
    let marker = "include_str!(\"../kernels/";
    let mut text = String::new();
    for (at, _) in listing.match_indices(marker) {
        let rest = &listing[at + marker.len()..];
        let name = &rest[..rest.find('"').expect("a closing quote")];
        let path = manifest.join("kernels").join(name);
        text.push_str(&std::fs::read_to_string(&path).expect("reading a kernel file"));
        text.push('\n');
    }
    assert!(
        text.contains("__global__"),
        "no kernel sources listed in src/kernels.rs"
    );
    text
}

/// One mode's C++ file: the program in namespace `tandem_emu_<suffix>`, with C linkage
/// dropped from kernels (both modes define the same names) and dynamic shared arrays
/// defined, a table of its kernels, and the C entry points the Rust side calls.
fn translation_unit(program: &str, suffix: &str, bf16: u8) -> String {
    let body = program.replace("extern \"C\" __global__", "__global__");
    let mut shared = Vec::new(); // (declaration without `extern __shared__`, name)
    let mut rest = body.as_str();
    while let Some(at) = rest.find("extern __shared__") {
        let decl = &rest[at + "extern __shared__".len()..];
        let end = decl.find(';').expect("a declaration ends with ;");
        let decl = decl[..end].trim().trim_end_matches("[]").to_string();
        let name = decl
            .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or_default()
            .to_string();
        if !shared.iter().any(|(_, n)| *n == name) {
            shared.push((decl, name));
        }
        rest = &rest[at + 1..];
    }
    let body = body.replace("extern __shared__", "extern thread_local");
    let body = static_shared(&body, bf16);
    let names = kernel_names(&body);

    let ns = format!("tandem_emu_{suffix}");
    let mut s = String::new();
    let _ = writeln!(s, "#define TANDEM_EMULATOR 1");
    let _ = writeln!(s, "#define TANDEM_ACT_BF16 {bf16}");
    let _ = writeln!(s, "#define TANDEM_ATTN_PARTITION {ATTN_PARTITION}");
    s.push_str("#include \"launch.hpp\"\n");
    let _ = writeln!(s, "namespace {ns} {{");
    s.push_str(&body);
    for (decl, _) in &shared {
        let _ = writeln!(s, "thread_local {decl}[{DYNAMIC_SHARED}];");
    }
    s.push_str("const ::tandem_emu::Kernel kernels[] = {\n");
    for n in &names {
        let _ = writeln!(s, "    ::tandem_emu::entry<&{n}>(\"{n}\"),");
    }
    s.push_str("};\n}\n");
    let dynamic = match shared.first() {
        Some((_, name)) => format!("{ns}::{name}"),
        None => "nullptr".into(),
    };
    let capacity = if shared.is_empty() { 0 } else { DYNAMIC_SHARED };
    let count = names.len();
    let _ = writeln!(
        s,
        "extern \"C\" int tandem_emu_launch_{suffix}(const char* name, const unsigned* grid, \
         unsigned block, unsigned shared, void** args, size_t num_args, char* err, \
         size_t err_len) {{\n    return ::tandem_emu::launch({ns}::kernels, {count}, name, grid, \
         block, shared, (unsigned char*){dynamic}, {capacity}, args, num_args, err, err_len);\n}}"
    );
    let _ = writeln!(
        s,
        "extern \"C\" const char* tandem_emu_kernel_name_{suffix}(size_t i) {{\n    return i < \
         {count} ? {ns}::kernels[i].name : nullptr;\n}}"
    );
    let _ = writeln!(
        s,
        "extern \"C\" size_t tandem_emu_attn_partition_{suffix}() {{ return {ATTN_PARTITION}; }}"
    );
    s
}

/// `program` with every (static) `__shared__` declaration, `__shared__ [__align__(n)] T
/// name[dims];`, turned into a reference to the emulator's shared memory for it
/// (`shared_static` in cuda_cpu.hpp): one buffer per declaration and numeric mode
/// (`mode`), filled with garbage before every block, so that a kernel reading shared
/// memory nobody in its block wrote fails its tests as on a GPU, instead of reading what
/// the previous block left.
fn static_shared(program: &str, mode: u8) -> String {
    let mut out = String::new();
    let mut rest = program;
    let mut id = u32::from(mode) * 100_000;
    while let Some(at) = rest.find("__shared__") {
        out.push_str(&rest[..at]);
        let decl = &rest[at + "__shared__".len()..];
        let end = decl.find(';').expect("a declaration ends with ;");
        let mut text = decl[..end].trim();
        if let Some(after) = text.strip_prefix("__align__") {
            let close = after.find(')').expect("__align__(n)");
            text = after[close + 1..].trim();
        }
        let dims_at = text.find('[').unwrap_or(text.len());
        let (head, dims) = text.split_at(dims_at);
        let name_at = head
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (ty, name) = (head[..name_at].trim(), head[name_at..].trim());
        assert!(
            !ty.is_empty() && !name.is_empty(),
            "cannot read the __shared__ declaration `{text}`"
        );
        let _ = write!(
            out,
            "auto& {name} = ::tandem_emu::shared_static<{ty} {dims}>({id})"
        );
        id += 1;
        rest = &decl[end..];
    }
    out.push_str(rest);
    out
}

/// Names of the `__global__` functions of `program`, in order.
fn kernel_names(program: &str) -> Vec<String> {
    program
        .match_indices("__global__ void ")
        .filter_map(|(at, m)| {
            let tail = &program[at + m.len()..];
            let end = tail.find('(')?;
            Some(tail[..end].trim().to_string())
        })
        .collect()
}

//! Link flags of the `sup` binary.
//!
//! On Linux with glibc 2.36 or newer, relative relocations are packed (`DT_RELR`): a PIE Rust
//! binary holds some 70 000 of them, and as plain `RELA` entries they are 1.7 MB that the
//! loader reads at every start, a tenth of a run's memory. Packed, they are a few kilobytes.
//! An older glibc cannot load such a binary, so the flag is given only when the glibc building
//! it (the one it is built for: no cross build) has it.
//!
//! In a release build linked by rust-lld (rustc's own linker on x86-64 Linux since 1.90), the
//! functions a `sup run` executes (`build/hot-functions.txt`) are laid out together at the
//! start of the code. Left where their crates put them, the 5 000 functions of a run, 1.6 MB,
//! lay on 1 700 of the binary's 5 300 pages of code, and the kernel maps the 64 KB around every
//! page it faults in: 15 MB of a 200-step run's 23 MB peak were the binary's code. The list
//! names functions by their mangled symbols, which change with the compiler, the dependencies
//! and their features; a name that is no longer in the binary is skipped, so a stale list only
//! packs less. `build/hot-functions.py` writes it anew from callgrind runs.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/hot-functions.txt");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let (os, env) = (var("CARGO_CFG_TARGET_OS"), var("CARGO_CFG_TARGET_ENV"));
    let native = std::env::var("HOST").ok() == std::env::var("TARGET").ok();
    if os == "linux" && env == "gnu" && native && glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    if var("TARGET") == "x86_64-unknown-linux-gnu"
        && var("PROFILE") == "release"
        && links_with_lld()
    {
        let list = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("build/hot-functions.txt");
        // -Xlinker and the path as one argument: -Wl, would split a path at its commas.
        println!("cargo:rustc-link-arg-bins=-Xlinker");
        println!(
            "cargo:rustc-link-arg-bins=--symbol-ordering-file={}",
            list.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether the binary is linked by rustc's own rust-lld: rustc 1.90 or newer, with no linker
/// of the user's (a `linker` in the configuration, or linker flags in RUSTFLAGS).
fn links_with_lld() -> bool {
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if std::env::var_os("RUSTC_LINKER").is_some() || flags.contains("link") {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = std::process::Command::new(rustc).arg("--version").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let mut parts = version
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (1, 90)
}

/// Whether this (build) machine's glibc is at least `major.minor`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: gnu_get_libc_version returns a pointer to a static NUL-terminated string.
    let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let mut parts = version
        .to_str()
        .unwrap_or("")
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc_at_least(_major: u32, _minor: u32) -> bool {
    false
}

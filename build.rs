//! Link flags of the `sup` binary. On Linux with glibc, relative relocations are packed
//! (`DT_RELR`): a PIE Rust binary holds some 70 000 of them, and as plain `RELA` entries they
//! are 1.7 MB that the loader reads at every start, a tenth of a run's memory. Packed, they
//! are a few kilobytes. Needs GNU ld 2.38 or lld to link and glibc 2.36 to run.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

//! Compiles the BPF programs in `bpf/` when the `bpf` feature is on.

use std::{env, path::PathBuf, process::Command};

fn main() {
    println!("cargo:rerun-if-changed=bpf");
    if env::var_os("CARGO_FEATURE_BPF").is_none() {
        return;
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    // The object depends on the target's byte order only: the BPF target
    // is chosen by it, and the build machine's headers serve every target
    // (-target bpf defines none of the macros that tell architectures'
    // headers apart). Debian puts asm/ under the multiarch directory, which
    // -target bpf does not search on its own.
    let bpf_target = match env::var("CARGO_CFG_TARGET_ENDIAN").as_deref() {
        Ok("big") => "bpfeb",
        _ => "bpfel",
    };
    let host = env::var("HOST").unwrap_or_else(|_| "x86_64-unknown-linux-gnu".to_owned());
    let host_arch = host.split('-').next().unwrap_or("x86_64");
    let multiarch = format!("/usr/include/{host_arch}-linux-gnu");
    let status = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", bpf_target, "-Wall", "-Werror", "-I", &multiarch, "-c",
        ])
        .arg("bpf/accel.bpf.c")
        .arg("-o")
        .arg(out.join("accel.bpf.o"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed on bpf/accel.bpf.c ({s})"),
        Err(e) => panic!(
            "the bpf feature needs clang to compile bpf/accel.bpf.c ({clang}: {e}); \
             Debian: apt-get install clang libbpf-dev"
        ),
    }
}

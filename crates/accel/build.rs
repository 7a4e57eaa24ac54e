//! Compiles the BPF programs in `bpf/` when the `bpf` feature is on.

use std::{env, path::PathBuf, process::Command};

fn main() {
    println!("cargo:rerun-if-changed=bpf");
    if env::var_os("CARGO_FEATURE_BPF").is_none() {
        return;
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    // Debian puts asm/ under the multiarch directory, which -target bpf
    // does not search on its own.
    let multiarch = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned())
    );
    let status = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-I", &multiarch, "-c",
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

//! Compiles `src/attention.c` into a shared library in `OUT_DIR` with the C compiler the `cc`
//! crate finds (what `CC` / the target select), and hands its path to the crate as
//! `DFLASH_C_ATTENTION_LIB`. `cc` itself builds static archives; a plugin must be a shared
//! library, so only the compiler comes from it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/attention.c");
    println!("cargo:rerun-if-changed=../../abi/include/dflash_attention.h");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = std::env::var("TARGET").unwrap_or_default();
    let (file, link_flag) = if target.contains("apple") {
        ("libc_attention.dylib", "-dynamiclib")
    } else {
        ("libc_attention.so", "-shared")
    };
    let lib = out.join(file);
    let compiler = cc::Build::new()
        .std("c11")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .get_compiler();
    if compiler.is_like_msvc() {
        panic!(
            "c-attention: the example's build script knows gcc/clang only (MSVC: build a DLL by hand)"
        );
    }
    println!("cargo:rerun-if-changed=src/layout_check.c");
    println!("cargo:rerun-if-changed=src/dlpack_first.c");
    println!("cargo:rerun-if-changed=src/dlpack_standin/dlpack.h");
    let syntax_check = |args: &[&str], failure: &str| {
        let mut check: Command = compiler.to_command();
        check
            .args(["-fsyntax-only", "-I", "../../abi/include"])
            .args(args);
        let status = check
            .status()
            .unwrap_or_else(|e| panic!("c-attention: cannot run the C compiler {check:?}: {e}"));
        assert!(status.success(), "c-attention: {failure} ({check:?})");
    };
    syntax_check(
        &["src/layout_check.c"],
        "the header's layouts differ from the Rust mirror's",
    );
    // dlpack.h first: 1.x names its version DLPACK_MAJOR_VERSION, 0.6-0.8 DLPACK_VERSION.
    for version in [None, Some("-DSTANDIN_DLPACK_0_8")] {
        let mut args = vec!["-I", "src/dlpack_standin", "src/dlpack_first.c"];
        args.extend(version);
        syntax_check(
            &args,
            "the header redefines what an earlier dlpack.h defined",
        );
    }
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-fPIC",
        link_flag,
        "-I",
        "../../abi/include",
        "src/attention.c",
        "-o",
    ])
    .arg(&lib)
    .arg("-lm");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("c-attention: cannot run the C compiler {cmd:?}: {e}"));
    assert!(status.success(), "c-attention: {cmd:?} failed ({status})");
    println!("cargo:rustc-env=DFLASH_C_ATTENTION_LIB={}", lib.display());
}

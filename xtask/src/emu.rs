//! `cargo xtask emu [--quick]`: the kernel lab's CPU emulators. Of the CUDA kernels
//! (`lab/cuda/emu`): the attention kernels (`emu_check.py`, against a float64 numpy reference)
//! and the memory-bound kernels (`ew_check.py`), which compile the CUDA C as host C++ (g++), so
//! they catch indexing, fragment-layout, masking and barrier bugs without a GPU. Of the wgpu
//! tensor-core GEMM (`lab/wgpu/coop_emu.py`): the WGSL transcribed into numpy, every index,
//! race and result checked. They say nothing about speed, the real PTX or a driver's SPIR-V.

use std::path::Path;
use std::process::{Command, ExitCode};

/// The emulator scripts, relative to the workspace root.
pub const SCRIPTS: [&str; 3] = [
    "lab/cuda/emu/emu_check.py",
    "lab/cuda/emu/ew_check.py",
    "lab/wgpu/coop_emu.py",
];

/// What the emulators need and is missing here (empty: all present).
pub fn missing_tools() -> Vec<&'static str> {
    let works = |prog: &str, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut missing = Vec::new();
    if !works("g++", &["--version"]) {
        missing.push("g++");
    }
    if !works("patch", &["--version"]) {
        missing.push("patch");
    }
    if !works("python3", &["-c", "import numpy"]) {
        missing.push("python3 with numpy");
    }
    missing
}

/// Whether `cargo xtask emu ARGS` asks for the quick pass; an error naming the first argument
/// that is not `--quick` (the scripts take no other, and one ignored would run what the user
/// did not ask for).
pub fn quick(args: &[String]) -> Result<bool, String> {
    match args.iter().find(|a| *a != "--quick") {
        Some(a) => Err(format!("unknown argument {a:?}")),
        None => Ok(!args.is_empty()),
    }
}

/// Runs every emulator script; the first failure's exit status, else success.
pub fn run(root: &Path, quick: bool) -> ExitCode {
    let missing = missing_tools();
    if !missing.is_empty() {
        eprintln!("xtask emu: needs {}", missing.join(", "));
        return ExitCode::FAILURE;
    }
    for script in SCRIPTS {
        let mut c = Command::new("python3");
        c.current_dir(root).arg(script);
        if quick {
            c.arg("--quick");
        }
        let code = crate::status(c);
        if code != ExitCode::SUCCESS {
            eprintln!("xtask emu: {script} failed");
            return code;
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emu_takes_quick_and_refuses_anything_else() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(quick(&args(&[])), Ok(false));
        assert_eq!(quick(&args(&["--quick"])), Ok(true));
        let e = quick(&args(&["--quick", "--quikc"])).unwrap_err();
        assert!(e.contains("--quikc"), "{e}");
        assert!(quick(&args(&["quick"])).is_err());
    }

    /// CI runs the quick emulator pass; a machine without g++ / numpy skips it and says so.
    #[test]
    fn the_cpu_emulators_pass_quick() {
        let missing = missing_tools();
        if !missing.is_empty() {
            println!("skipped: the CPU emulators need {}", missing.join(", "));
            return;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask is in the workspace");
        for script in SCRIPTS {
            let out = Command::new("python3")
                .current_dir(root)
                .args([script, "--quick"])
                .output()
                .unwrap_or_else(|e| panic!("run {script}: {e}"));
            assert!(
                out.status.success(),
                "{script} --quick failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

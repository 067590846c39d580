//! `dflash train --resume` of a directory that is not a run says so, rather than advising on
//! the run config it lacks.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_dflash");

#[test]
fn resume_of_a_directory_that_is_no_run_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-run");
    for dir in [tmp.path(), missing.as_path()] {
        let out = Command::new(BIN)
            .arg("train")
            .arg("--resume")
            .arg(dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("not a run directory")
                && stderr.contains("no config.toml, no checkpoints/latest"),
            "{stderr}"
        );
        // The advice for a run that lost its config does not apply.
        assert!(!stderr.contains("the run's config is missing"), "{stderr}");
    }
}

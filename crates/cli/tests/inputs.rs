//! The binary on inputs it must not take silently.

mod common;

use common::Job;

/// A `drafter.mask_token_id` that occurs in the data: the run trains, warns once when it
/// first meets it, and counts the samples holding it in the data line at the end.
#[test]
fn a_mask_token_id_that_occurs_in_the_data_is_a_counted_warning() {
    let job = Job::new();
    let first = std::fs::read_to_string(job.data()).unwrap();
    let first: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    let token = first["input_ids"][0].as_u64().unwrap();
    let mut c = job.command("mask", false);
    c.args(["--set", &format!("drafter.mask_token_id={token}")]);
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Samples come in schedule order: the warning names whichever came first.
    let warning = format!("holds the mask token id {token} (position ");
    assert_eq!(stderr.matches(&warning).count(), 1, "{stderr}");
    let data = stderr
        .lines()
        .find(|l| l.starts_with("data: "))
        .unwrap_or_default();
    assert!(
        data.contains(&format!(
            "holding the mask token id {token}, first: sample 0, position 0"
        )),
        "{stderr}"
    );

    // The default id (an unused row of this vocabulary) raises nothing.
    let (_, stderr) = job.finish("default", false);
    assert!(!stderr.contains("mask token"), "{stderr}");
}

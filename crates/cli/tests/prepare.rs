//! The user path on the embedded tiny target: chat JSONL -> `dflash prepare` -> `dflash train`
//! (two steps on the CPU reference backend).

use std::path::Path;
use std::process::Command;

const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");

fn dflash(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Twelve two- or four-turn conversations about Python, one with an unknown role; the file
/// starts with a UTF-8 byte order mark.
fn write_chat(path: &Path) {
    let mut text = String::from("\u{feff}");
    for i in 0..12 {
        let q = format!("How do I add {i} to every item of a list in Python?");
        let a = format!("Use a list comprehension:\n\n    ys = [x + {i} for x in xs]\n");
        let line = if i % 3 == 0 {
            serde_json::json!({"system": "You write Python.", "conversations": [
                {"from": "human", "value": q}, {"from": "gpt", "value": a},
                {"from": "human", "value": "And in place?"},
                {"from": "gpt", "value": format!("for k in range(len(xs)):\n    xs[k] += {i}")}]})
        } else {
            serde_json::json!({"messages": [
                {"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        };
        text += &line.to_string();
        text.push('\n');
    }
    text += r#"{"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y"}]}"#;
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

#[test]
fn prepare_then_train_two_steps_on_the_embedded_target() {
    let tmp = tempfile::tempdir().unwrap();
    let chat = tmp.path().join("chat.jsonl");
    let prepared = tmp.path().join("prepared");
    write_chat(&chat);
    let prepare = || {
        let (data, out) = (chat.to_str().unwrap(), prepared.to_str().unwrap());
        dflash(&[
            "prepare",
            "--target",
            TARGET,
            "--data",
            data,
            "--out",
            out,
            "--buckets",
            "128,256",
        ])
    };
    let (ok, out) = prepare();
    assert!(ok, "{out}");
    assert!(
        out.contains("samples: 13 read, 12 written, 1 skipped"),
        "{out}"
    );
    assert!(
        out.contains("sample 12: message 0: unknown role \"narrator\""),
        "{out}"
    );
    assert!(prepared.join("data-00000-of-00001.arrow").is_file());
    assert!(prepared.join("state.json").is_file());
    assert!(prepared.join("dataset_info.json").is_file());

    // Refuses to overwrite.
    let (ok, again) = prepare();
    assert!(!ok && again.contains("already exists"), "{again}");

    let config = tmp.path().join("job.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[target]
path = {TARGET:?}

[drafter]
num_layers = 1
block_size = 4
num_target_features = 2

[data]
train = {data:?}
max_len = 256
bucket_bounds = [128, 256]
token_budget = 512
num_anchors = 8

[train]
epochs = 1
max_steps = 2
micro_batches_per_step = 1
lr = 3e-3
seed = 1
save_every = 0
log_every = 100

[backend]
name = "reference"
attention = "tiled"

[pipeline]
target_workers = 1
drafter_workers = 1
queue_capacity = 2
timeout_secs = 60

[run]
dir = {runs:?}
name = "run"
"#,
            data = prepared.display().to_string(),
            runs = tmp.path().join("runs").display().to_string(),
        ),
    )
    .unwrap();
    let (ok, out) = dflash(&["train", "--config", config.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("steps=2"), "{out}");
}

/// The DFlash recipe's path: chat JSONL -> `dflash regenerate` (the target writes the answers)
/// -> `dflash prepare` on its output. A second run continues the file and generates nothing,
/// not even for the sample dropped before; `prepare` reads the conversations alone.
#[test]
fn regenerate_then_prepare_on_the_embedded_target() {
    let tmp = tempfile::tempdir().unwrap();
    let chat = tmp.path().join("chat.jsonl");
    let regenerated = tmp.path().join("regenerated.jsonl");
    let prepared = tmp.path().join("prepared");
    write_chat(&chat);
    let regenerate = || {
        let (data, out) = (chat.to_str().unwrap(), regenerated.to_str().unwrap());
        dflash(&[
            "regenerate",
            "--target",
            TARGET,
            "--data",
            data,
            "--out",
            out,
            "--batch",
            "5",
            "--max-new-tokens",
            "24",
            // The tiny target reaches the limit on every answer; truncated answers are
            // dropped unless kept.
            "--keep-truncated",
            "--threads",
            "2",
        ])
    };
    let (ok, out) = regenerate();
    assert!(ok, "{out}");
    assert!(
        out.contains("samples: 13 read, 12 generated, 0 already done, 1 skipped"),
        "{out}"
    );
    assert!(out.contains("skipped sample 12"), "{out}");
    let text = std::fs::read_to_string(&regenerated).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    for line in &lines {
        let messages = line["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        assert_eq!(last["role"], "assistant", "{line}");
        // Every assistant turn is the target's, each at most --max-new-tokens long.
        let turns = line["turns"].as_u64().unwrap();
        let assistant = messages.iter().filter(|m| m["role"] == "assistant").count();
        assert_eq!(turns as usize, assistant, "{line}");
        let new_tokens = line["new_tokens"].as_u64().unwrap();
        assert!((turns..=24 * turns).contains(&new_tokens), "{line}");
        // The prompt is kept: the turn before the answer is the user's, as in the input.
        assert_eq!(messages[messages.len() - 2]["role"], "user", "{line}");
    }

    // The drop is recorded beside the output.
    let record = tmp.path().join("regenerated.jsonl.skipped.jsonl");
    let record_text = std::fs::read_to_string(&record).unwrap();
    assert_eq!(record_text.lines().count(), 1, "{record_text}");
    assert!(record_text.starts_with(r#"{"index":12,"#), "{record_text}");

    let (ok, again) = regenerate();
    assert!(ok, "{again}");
    assert!(
        again.contains("13 already done (1 of them skipped before)")
            && again.contains("0 generated")
            && again.contains("0 skipped"),
        "{again}"
    );
    assert_eq!(std::fs::read_to_string(&regenerated).unwrap(), text);
    assert_eq!(std::fs::read_to_string(&record).unwrap(), record_text);

    let (data, out) = (regenerated.to_str().unwrap(), prepared.to_str().unwrap());
    let (ok, out) = dflash(&[
        "prepare",
        "--target",
        TARGET,
        "--data",
        data,
        "--out",
        out,
        "--buckets",
        "128,256",
    ]);
    assert!(ok, "{out}");
    assert!(prepared.join("state.json").is_file(), "{out}");
    assert!(out.contains("samples: 12 read"), "{out}");
}

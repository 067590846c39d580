//! The loop's plumbing with stand-ins for the target: the reader thread's failures reach
//! the caller, and a generation that stops stops the reader too.

use std::sync::atomic::{AtomicUsize, Ordering};

use dflash_prepare::{Message, Role};
use serde_json::json;

use super::*;

fn preparer() -> Preparer {
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-target");
    Preparer::from_target_dir(&tiny, None).unwrap()
}

/// A JSONL dataset of `rows` one-turn conversations.
fn dataset(dir: &std::path::Path, rows: usize) -> Input {
    let path = dir.join("chats.jsonl");
    let line = json!({"messages": [{"role": "user", "content": "x"}]}).to_string() + "\n";
    std::fs::write(&path, line.repeat(rows)).unwrap();
    Input::open(&path).unwrap()
}

/// Row `i` as a one-token prompt (the tokenizer and template play no part).
fn turn(i: u64) -> Item {
    let user = Message {
        role: Role::User,
        content: "x".into(),
    };
    Item::Turn(
        Prompt {
            id: i,
            ids: vec![1],
        },
        Conversation::new(i, vec![user]).unwrap(),
    )
}

const SETTINGS: Settings = Settings {
    capacity: 16,
    keep_truncated: false,
    progress: false,
};

/// A generation that answers every prompt at once with EOS (an empty answer).
fn answer_all(
    prompts: &mut dyn Iterator<Item = Prompt>,
    done: &mut Done<'_>,
) -> dflash_models::Result<GenerateStats> {
    let stats = GenerateStats::default();
    for p in prompts {
        let g = Generated {
            id: p.id,
            prompt_len: p.ids.len(),
            tokens: vec![257],
            finish: Finish::Eos,
        };
        done(g, &stats)?;
    }
    Ok(stats)
}

#[test]
fn a_reader_that_panics_is_an_error_not_a_short_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = dataset(dir.path(), 10);
    let mut out = Output::open(&dir.path().join("out.jsonl"), &json!({})).unwrap();
    let to_item = |i: u64, _: &Value| {
        if i == 3 {
            panic!("injected reader panic");
        }
        turn(i)
    };
    let e = drive(
        &input,
        &preparer(),
        &mut out,
        &SETTINGS,
        &to_item,
        answer_all,
    )
    .unwrap_err();
    assert!(matches!(e, RegenerateError::ReaderPanicked { .. }), "{e}");
    assert!(e.to_string().contains("injected reader panic"), "{e}");
    // What was answered before the panic is written: a restart continues from it.
    assert_eq!(out.done().len(), 3);
}

#[test]
fn a_failed_generation_stops_the_reader_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let rows = AHEAD + 80 * CHUNK;
    let input = dataset(dir.path(), rows);
    let mut out = Output::open(&dir.path().join("out.jsonl"), &json!({})).unwrap();
    let calls = AtomicUsize::new(0);
    let to_item = |i: u64, _: &Value| {
        calls.fetch_add(1, Ordering::SeqCst);
        turn(i)
    };
    let fail = |prompts: &mut dyn Iterator<Item = Prompt>, _: &mut Done<'_>| {
        prompts.next();
        Err(ModelError::Input("injected generation failure".into()))
    };
    let e = drive(&input, &preparer(), &mut out, &SETTINGS, &to_item, fail).unwrap_err();
    assert!(e.to_string().contains("injected generation failure"), "{e}");
    // The channel held AHEAD rows, the generation took one, one more was on its way; the
    // rest of the dataset is never turned into prompts.
    let calls = calls.load(Ordering::SeqCst);
    assert!(calls <= AHEAD + 2, "{calls} of {rows} rows were read");
}

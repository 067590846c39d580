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

/// Row `i` as a two-turn conversation; its prompts are rendered by the tiny target.
fn two_turns(i: u64) -> Item {
    let m = |role, content: &str| Message {
        role,
        content: content.into(),
    };
    let conv = Conversation::new(
        i,
        vec![
            m(Role::User, "x"),
            m(Role::Assistant, "y"),
            m(Role::User, "z"),
        ],
    )
    .unwrap();
    let p = conv.next_prompt(&preparer(), 4096).unwrap();
    Item::Turn(p, conv)
}

const ROOMY: Settings = Settings {
    capacity: 4096,
    keep_truncated: false,
    progress: false,
};

#[test]
fn a_generation_error_names_the_sample_and_turn_not_the_sequence_id() {
    let dir = tempfile::tempdir().unwrap();
    let input = dataset(dir.path(), 8);
    let mut out = Output::open(&dir.path().join("out.jsonl"), &json!({})).unwrap();
    let to_item = |i: u64, _: &Value| two_turns(i);
    // Answers every turn with EOS, and fails on sample 7's second turn.
    let fail_late = |prompts: &mut dyn Iterator<Item = Prompt>, done: &mut Done<'_>| {
        let stats = GenerateStats::default();
        for p in prompts {
            if sample_of(p.id) == 7 && p.id != 7 {
                return Err(ModelError::Sequence {
                    id: p.id,
                    detail: "generate: injected failure".into(),
                });
            }
            let g = Generated {
                id: p.id,
                prompt_len: p.ids.len(),
                tokens: vec![257],
                finish: Finish::Eos,
            };
            done(g, &stats)?;
        }
        Ok(stats)
    };
    let e = drive(&input, &preparer(), &mut out, &ROOMY, &to_item, fail_late).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("sample 7, turn 2: generate: injected failure"),
        "{msg}"
    );
    assert!(!msg.contains("1099511627783"), "{msg}");
}

/// A generation that answers first turns with EOS and cuts every later one with `later`.
fn cut_later(
    later: Finish,
) -> impl FnOnce(&mut dyn Iterator<Item = Prompt>, &mut Done<'_>) -> dflash_models::Result<GenerateStats>
{
    move |prompts, done| {
        let stats = GenerateStats::default();
        for p in prompts {
            let first = sample_of(p.id) == p.id;
            let g = Generated {
                id: p.id,
                prompt_len: p.ids.len(),
                tokens: if first { vec![257] } else { vec![65, 66] },
                finish: if first { Finish::Eos } else { later },
            };
            done(g, &stats)?;
        }
        Ok(stats)
    }
}

#[test]
fn a_later_answer_cut_by_the_capacity_keeps_the_answers_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dataset(dir.path(), 2);
    let path = dir.path().join("out.jsonl");
    let mut out = Output::open(&path, &json!({})).unwrap();
    let to_item = |i: u64, _: &Value| two_turns(i);
    let s = drive(
        &input,
        &preparer(),
        &mut out,
        &ROOMY,
        &to_item,
        cut_later(Finish::Capacity),
    )
    .unwrap();
    assert_eq!(
        (s.generated, s.skipped.len(), s.truncated),
        (2, 0, 0),
        "{s}"
    );
    assert_eq!(s.shortened.len(), 2, "{s}");
    let (i, reason) = &s.shortened[0];
    assert!(
        *i == 0 && reason.starts_with("turn 2 of 2: the answer was cut by capacity"),
        "{reason}"
    );
    // Written up to the first answer, the cut one left out.
    let text = std::fs::read_to_string(&path).unwrap();
    let line: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(line["turns"], 1, "{line}");
    assert_eq!(line["finish_reason"], "eos", "{line}");
    assert_eq!(line["messages"].as_array().unwrap().len(), 2, "{line}");

    // Cut by max_new_tokens, the sample is dropped as before.
    let path = dir.path().join("max.jsonl");
    let mut out = Output::open(&path, &json!({})).unwrap();
    let s = drive(
        &input,
        &preparer(),
        &mut out,
        &ROOMY,
        &to_item,
        cut_later(Finish::MaxNewTokens),
    )
    .unwrap_err();
    assert!(
        matches!(s, RegenerateError::AllSkipped { total: 2, .. })
            && s.to_string().contains("cut by max_new_tokens"),
        "{s}"
    );
}

//! `regenerate` end to end on the embedded tiny target, what it drops and what a restart
//! finds:
//! - the output is JSONL conversations that `dflash prepare` turns into training data;
//! - a restart continues: finished lines are kept, a torn last line is cut off, only the
//!   missing samples are generated, and other settings (another backend among them) are
//!   refused;
//! - a conversation whose later turn outgrows the capacity is written up to its last answer;
//! - samples without anything to answer (an empty prompt among them) are skipped with a
//!   reason and recorded, so a restart does not try them again; all skipped is an error.

mod common;

use common::*;
use dflash_prepare::Preparer;
use dflash_regenerate::{RegenerateError, regenerate};
use serde_json::json;

#[test]
fn output_prepares_and_a_restart_continues_where_it_stopped() {
    let (_, rows) = golden_rows();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chats.jsonl");
    write_jsonl(&data, &rows);
    let out = dir.path().join("out.jsonl");
    regenerate(backend(), &opts(&data, &out, 3, 16)).unwrap();
    let full = std::fs::read_to_string(&out).unwrap();
    let whole = read_out(&out);

    // Keep two lines and half of the third, as a kill in the middle of a write leaves it.
    let lines: Vec<&str> = full.lines().collect();
    let torn = format!(
        "{}\n{}\n{}",
        lines[0],
        lines[1],
        &lines[2][..lines[2].len() / 2]
    );
    std::fs::write(&out, torn).unwrap();
    let s = regenerate(backend(), &opts(&data, &out, 2, 16)).unwrap();
    assert_eq!((s.samples, s.resumed, s.generated), (6, 2, 4));
    assert_eq!(
        read_out(&out),
        whole,
        "the continued file holds the same answers"
    );
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .starts_with(&format!("{}\n{}\n", lines[0], lines[1]))
    );
    let s = regenerate(backend(), &opts(&data, &out, 2, 16)).unwrap();
    assert_eq!(
        (s.resumed, s.generated),
        (6, 0),
        "a finished file is left as it is"
    );

    // Other settings would mix answers of two kinds in one file.
    let mut other = opts(&data, &out, 2, 16);
    other.sampling.temperature = 0.7;
    let e = regenerate(backend(), &other).unwrap_err();
    assert!(matches!(e, RegenerateError::Resume { .. }), "{e}");
    assert!(e.to_string().contains("temperature"), "{e}");

    // The output is chat data for prepare: the empty EOS answer is skipped there.
    let prepared = dir.path().join("prepared");
    let summary = dflash_prepare::prepare(&dflash_prepare::PrepareOptions {
        target: tiny_target(),
        chat_template: None,
        data: out.clone(),
        out: prepared.clone(),
        bucket_bounds: vec![64, 128],
        progress: false,
    })
    .unwrap();
    assert_eq!((summary.samples, summary.written), (6, 5), "{summary}");
    assert_eq!(dflash_data::open_dataset(&prepared).unwrap().len(), 5);
}

#[test]
fn a_conversation_outgrowing_the_capacity_keeps_its_answered_turns() {
    let preparer = Preparer::from_target_dir(&tiny_target(), None).unwrap();
    let conv = json!({"messages": [
        {"role": "user", "content": "def f():\n"},
        {"role": "assistant", "content": "the dataset's first answer"},
        {"role": "user", "content": "and g?"},
        {"role": "assistant", "content": "the dataset's second answer"},
    ]});
    let mut msgs = dflash_prepare::parse_conversation(&conv).unwrap();
    let answers = dflash_regenerate::prompt::answer_turns(&mut msgs).unwrap();
    let first = dflash_regenerate::prompt::prompt_ids(&preparer, &msgs[..answers[0]])
        .unwrap()
        .len();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chat.jsonl");
    write_jsonl(&data, std::slice::from_ref(&conv));
    // Room for the first prompt and two answer tokens; the second prompt holds all of
    // that and more.
    let out = dir.path().join("out.jsonl");
    let mut o = opts(&data, &out, 1, 4);
    o.capacity = Some(first + 2);
    let s = regenerate(backend(), &o).unwrap();
    assert_eq!((s.generated, s.turns, s.skipped.len()), (1, 1, 0), "{s}");
    assert_eq!(s.shortened.len(), 1, "{s}");
    let (i, reason) = &s.shortened[0];
    assert_eq!(*i, 0);
    assert!(
        reason.starts_with("turn 2 of 2: the prompt has")
            && reason.contains(&format!("capacity of {}", first + 2)),
        "{reason}"
    );
    let said = s.to_string();
    assert!(
        said.contains("1 generated (1 shortened") && said.contains("shortened sample 0: turn 2"),
        "{said}"
    );
    // Written up to the target's answer: the first turn, its later turns left out.
    let line = &read_out(&out)[0].1;
    let written = line["messages"].as_array().unwrap();
    assert_eq!(written.len(), 2, "{line}");
    assert_eq!(written[0], conv["messages"][0]);
    assert_eq!(written[1]["role"], "assistant");
    assert_ne!(written[1]["content"], "the dataset's first answer");
    assert_eq!(line["turns"], 1);
    // A restart finds it written.
    let again = regenerate(backend(), &o).unwrap();
    assert_eq!((again.resumed, again.generated), (1, 0), "{again}");

    // Where not even the first turn fits, there is nothing to write: skipped as before.
    o.out = dir.path().join("none.jsonl");
    o.capacity = Some(first);
    let e = regenerate(backend(), &o).unwrap_err();
    assert!(
        matches!(e, RegenerateError::AllSkipped { total: 1, .. })
            && e.to_string().contains("turn 1 of 2: the prompt has"),
        "{e}"
    );
}

#[test]
fn samples_with_nothing_to_answer_are_skipped_and_all_skipped_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chats.jsonl");
    let rows = [
        json!({"messages": [{"role": "user", "content": "def f():\n"}]}),
        json!({"messages": [{"role": "assistant", "content": "only an answer"}]}),
        json!({"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}, {"from": "gpt", "value": "z"}]}),
        json!({"messages": [{"role": "user", "content": "a".repeat(300)}]}),
        json!({"text": "no conversation"}),
        // The second turn's prompt holds the first answer and 300 more characters.
        json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "a".repeat(300)}]}),
    ];
    write_jsonl(&data, &rows);
    let out = dir.path().join("out.jsonl");
    let s = regenerate(backend(), &opts(&data, &out, 2, 4)).unwrap();
    assert_eq!((s.samples, s.generated), (6, 2));
    let reasons: Vec<(u64, &str)> = s.skipped.iter().map(|(i, r)| (*i, r.as_str())).collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    assert!(
        reasons[0].0 == 1 && reasons[0].1.contains("no user turn"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].0 == 2 && reasons[1].1.contains("follows a assistant turn"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].0 == 3 && reasons[2].1.contains("capacity of 256"),
        "{reasons:?}"
    );
    assert!(reasons[3].0 == 4, "{reasons:?}");
    // The first turn is answered; the second outgrows the capacity: written shortened.
    let (i, r) = &s.shortened[0];
    assert!(
        *i == 5 && r.starts_with("turn 2 of 2: the prompt has") && r.contains("capacity of 256"),
        "{:?}",
        s.shortened
    );

    write_jsonl(&data, &rows[1..5]);
    let o2 = opts(&data, &dir.path().join("o2.jsonl"), 2, 4);
    let e = regenerate(backend(), &o2).unwrap_err();
    assert!(
        matches!(e, RegenerateError::AllSkipped { total: 4, .. }),
        "{e}"
    );
    // A restart reads the drops back: still nothing written, and the reasons are the
    // recorded ones.
    let e = regenerate(backend(), &o2).unwrap_err();
    assert!(
        matches!(e, RegenerateError::AllSkipped { total: 4, .. })
            && e.to_string()
                .contains("the assistant turn (skipped before)"),
        "{e}"
    );
}

#[test]
fn an_empty_prompt_skips_its_sample_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("bare.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let data = dir.path().join("chats.jsonl");
    let rows = [
        json!({"messages": [{"role": "user", "content": "def f():\n"}]}),
        json!({"messages": [{"role": "user", "content": ""}]}),
        json!({"messages": [{"role": "user", "content": "x"}]}),
    ];
    write_jsonl(&data, &rows);
    let out = dir.path().join("out.jsonl");
    let mut o = opts(&data, &out, 2, 4);
    o.chat_template = Some(template);
    let s = regenerate(backend(), &o).unwrap();
    assert_eq!((s.samples, s.generated, s.skipped.len()), (3, 2, 1), "{s}");
    let (i, reason) = &s.skipped[0];
    assert!(*i == 1 && reason.contains("empty prompt"), "{reason}");
    // Recorded like any drop: a restart finds every sample handled.
    let skips = std::fs::read_to_string(dflash_regenerate::output::skipped_path(&out)).unwrap();
    assert!(skips.contains("\"index\":1"), "{skips}");
    let again = regenerate(backend(), &o).unwrap();
    assert_eq!(
        (again.resumed, again.resumed_skipped, again.generated),
        (3, 1, 0),
        "{again}"
    );
}

#[test]
fn an_output_of_another_backend_is_not_continued() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chats.jsonl");
    write_jsonl(
        &data,
        &[json!({"messages": [{"role": "user", "content": "def f():\n"}]})],
    );
    let out = dir.path().join("out.jsonl");
    let o = opts(&data, &out, 1, 4);
    regenerate(backend(), &o).unwrap();
    let meta_file = dflash_regenerate::output::meta_path(&out);
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta_file).unwrap()).unwrap();
    assert_eq!(meta["backend"], "reference", "{meta}");
    // As another backend would have written it: its logits round otherwise.
    meta["backend"] = json!("cuda");
    std::fs::write(&meta_file, meta.to_string()).unwrap();
    let e = regenerate(backend(), &o).unwrap_err();
    assert!(
        matches!(e, RegenerateError::Resume { .. })
            && e.to_string()
                .contains(r#"backend: "cuda" then, "reference" now"#),
        "{e}"
    );
}

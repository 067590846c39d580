//! `regenerate` on the embedded tiny target against HF transformers, end to end:
//! - `fixtures/generate_golden.json` (made by `fixtures/make_generate_golden.py`: HF
//!   `apply_chat_template` + greedy `generate`, float32 on the CPU): our prompt ids are HF's
//!   and our greedy answers are HF's token for token, at batch sizes 1, 2 and 6;
//! - the output is JSONL conversations that `dflash prepare` turns into training data;
//! - a restart continues: finished lines are kept, a torn last line is cut off, only the
//!   missing samples are generated, and other settings are refused;
//! - samples without anything to answer are skipped with a reason; all skipped is an error.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dflash_core::Backend;
use dflash_core::registry::BackendOptions;
use dflash_models::generate::Sampling;
use dflash_prepare::Preparer;
use dflash_regenerate::{RegenerateError, RegenerateOptions, regenerate};
use serde_json::{Value, json};

fn tiny_target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-target")
}

fn golden() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/generate_golden.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn backend() -> Arc<dyn Backend> {
    dflash_backend_reference::link();
    dflash_attention_tiled::link();
    dflash_core::registry::create_backend(
        "reference",
        &BackendOptions {
            attention: "tiled".into(),
            threads: 2,
            device: 0,
        },
    )
    .unwrap()
}

fn write_jsonl(path: &Path, rows: &[Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

fn opts(data: &Path, out: &Path, batch: usize, max_new: usize) -> RegenerateOptions {
    RegenerateOptions {
        target: tiny_target(),
        chat_template: None,
        data: data.to_path_buf(),
        out: out.to_path_buf(),
        batch,
        max_new_tokens: max_new,
        capacity: Some(256),
        prefill_tokens: 4096,
        sampling: Sampling::default(),
        progress: false,
    }
}

/// `(index, line)` of every output line, sorted by index.
fn read_out(path: &Path) -> Vec<(u64, Value)> {
    let mut rows: Vec<(u64, Value)> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["index"].as_u64().unwrap(), v)
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    rows
}

fn golden_rows() -> (Vec<Value>, Vec<Value>) {
    let g = golden();
    let cases = g["cases"].as_array().unwrap().clone();
    let rows = cases
        .iter()
        .map(|c| json!({"messages": c["messages"]}))
        .collect();
    (cases, rows)
}

#[test]
fn prompts_are_tokenized_as_transformers_does() {
    let preparer = Preparer::from_target_dir(&tiny_target(), None).unwrap();
    for (i, case) in golden()["cases"].as_array().unwrap().iter().enumerate() {
        let msgs = dflash_prepare::parse_conversation(case).unwrap();
        let turns = dflash_regenerate::prompt::prompt_turns(msgs).unwrap();
        let ids = dflash_regenerate::prompt::prompt_ids(&preparer, &turns).unwrap();
        let want: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        assert_eq!(ids, want, "case {i}");
    }
}

#[test]
fn greedy_answers_are_transformers_token_for_token_at_every_batch_size() {
    let g = golden();
    let max_new = g["max_new_tokens"].as_u64().unwrap() as usize;
    let (cases, rows) = golden_rows();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chats.jsonl");
    write_jsonl(&data, &rows);
    for batch in [1, 2, 6] {
        let out = dir.path().join(format!("out-{batch}.jsonl"));
        let s = regenerate(backend(), &opts(&data, &out, batch, max_new)).unwrap();
        assert_eq!(
            (s.samples, s.generated, s.resumed),
            (6, 6, 0),
            "batch {batch}"
        );
        let got = read_out(&out);
        for ((i, line), case) in got.iter().zip(&cases) {
            let want_ids = case["generated_ids"].as_array().unwrap();
            assert_eq!(
                line["new_tokens"].as_u64().unwrap() as usize,
                want_ids.len(),
                "batch {batch}, case {i}"
            );
            let msgs = line["messages"].as_array().unwrap();
            let answer = msgs.last().unwrap();
            assert_eq!(answer["role"], "assistant");
            assert_eq!(answer["content"], case["text"], "batch {batch}, case {i}");
            // The prompt turns are kept as they were; the final assistant turn is replaced.
            let prompt = case["messages"].as_array().unwrap();
            let kept = prompt.len() - usize::from(prompt.last().unwrap()["role"] == "assistant");
            assert_eq!(msgs.len(), kept + 1, "case {i}");
            assert_eq!(&msgs[..kept], &prompt[..kept], "case {i}");
            let eos = want_ids.last().unwrap().as_u64() == Some(257);
            let reason = if eos { "eos" } else { "max_new_tokens" };
            assert_eq!(line["finish_reason"], reason, "case {i}");
        }
    }
}

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
fn samples_with_nothing_to_answer_are_skipped_and_all_skipped_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chats.jsonl");
    let rows = [
        json!({"messages": [{"role": "user", "content": "def f():\n"}]}),
        json!({"messages": [{"role": "assistant", "content": "only an answer"}]}),
        json!({"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}, {"from": "gpt", "value": "z"}]}),
        json!({"messages": [{"role": "user", "content": "a".repeat(300)}]}),
        json!({"text": "no conversation"}),
    ];
    write_jsonl(&data, &rows);
    let out = dir.path().join("out.jsonl");
    let s = regenerate(backend(), &opts(&data, &out, 2, 4)).unwrap();
    assert_eq!((s.samples, s.generated), (5, 1));
    let reasons: Vec<(u64, &str)> = s.skipped.iter().map(|(i, r)| (*i, r.as_str())).collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    assert!(
        reasons[0].0 == 1 && reasons[0].1.contains("no user turn"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].0 == 2 && reasons[1].1.contains("ends with a assistant"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].0 == 3 && reasons[2].1.contains("capacity of 256"),
        "{reasons:?}"
    );
    assert!(reasons[3].0 == 4, "{reasons:?}");

    write_jsonl(&data, &rows[1..]);
    let e = regenerate(backend(), &opts(&data, &dir.path().join("o2.jsonl"), 2, 4)).unwrap_err();
    assert!(
        matches!(e, RegenerateError::AllSkipped { total: 4, .. }),
        "{e}"
    );
}

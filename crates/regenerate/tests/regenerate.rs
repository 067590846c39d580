//! `regenerate` on the embedded tiny target against HF transformers, end to end:
//! - `fixtures/generate_golden.json` (made by `fixtures/make_generate_golden.py`: HF
//!   `apply_chat_template` + greedy `generate`, float32 on the CPU, each conversation's
//!   final turn answered with its earlier turns as written): our prompt ids are HF's and our
//!   greedy answers to those prompts are HF's token for token; end to end, the one-turn
//!   conversations' answers are HF's at batch sizes 1, 2 and 6;
//! - a conversation of several assistant turns gets each written by the target in turn,
//!   conditioned on its own earlier answers;
//! - answers cut by `max_new_tokens` drop their sample unless `keep_truncated`;
//! - the output is JSONL conversations that `dflash prepare` turns into training data;
//! - a restart continues: finished lines are kept, a torn last line is cut off, only the
//!   missing samples are generated, and other settings are refused;
//! - samples without anything to answer are skipped with a reason; all skipped is an error;
//! - a file-name pattern is a dataset; a KV cache past the free memory is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dflash_core::Backend;
use dflash_core::registry::BackendOptions;
use dflash_models::Qwen3Target;
use dflash_models::generate::{GenerateOptions, Prompt, Sampling, generate};
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
        // Most golden answers run to max_new_tokens.
        keep_truncated: true,
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

/// The golden prompt of `case`: its final turn's, earlier turns as written.
fn golden_prompt(preparer: &Preparer, case: &Value) -> Vec<u32> {
    let mut msgs = dflash_prepare::parse_conversation(case).unwrap();
    let answers = dflash_regenerate::prompt::answer_turns(&mut msgs).unwrap();
    let last = *answers.last().unwrap();
    dflash_regenerate::prompt::prompt_ids(preparer, &msgs[..last]).unwrap()
}

#[test]
fn prompts_are_tokenized_as_transformers_does() {
    let preparer = Preparer::from_target_dir(&tiny_target(), None).unwrap();
    for (i, case) in golden()["cases"].as_array().unwrap().iter().enumerate() {
        let want: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        assert_eq!(golden_prompt(&preparer, case), want, "case {i}");
    }
}

/// Greedy answers of the tiny target to `prompts` through `dflash_models::generate`.
fn generate_greedy(prompts: &[Vec<u32>], max_new: usize, batch: usize) -> Vec<Vec<u32>> {
    let cfg = dflash_config::Qwen3Config::from_file(tiny_target().join("config.json")).unwrap();
    let target =
        Qwen3Target::load(backend(), &tiny_target(), &[cfg.num_hidden_layers - 1]).unwrap();
    let opts = GenerateOptions {
        batch,
        capacity: 256,
        max_new_tokens: max_new,
        prefill_tokens: 4096,
        eos: vec![257],
        sampling: Sampling::default(),
    };
    let mut it = prompts.iter().enumerate().map(|(i, ids)| Prompt {
        id: i as u64,
        ids: ids.clone(),
    });
    let mut got = vec![Vec::new(); prompts.len()];
    generate(&target, &opts, &mut it, &mut |g, _| {
        got[g.id as usize] = g.tokens;
        Ok(())
    })
    .unwrap();
    got
}

#[test]
fn greedy_answers_to_the_golden_prompts_are_transformers_token_for_token() {
    let g = golden();
    let max_new = g["max_new_tokens"].as_u64().unwrap() as usize;
    let cases = g["cases"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| serde_json::from_value(c["prompt_ids"].clone()).unwrap())
        .collect();
    let got = generate_greedy(&prompts, max_new, 3);
    for (i, (got, case)) in got.iter().zip(cases).enumerate() {
        let want: Vec<u32> = serde_json::from_value(case["generated_ids"].clone()).unwrap();
        assert_eq!(got, &want, "case {i}");
    }
}

/// Whether golden case `case` has a single assistant turn to write.
fn one_turn(case: &Value) -> bool {
    let roles = case["messages"].as_array().unwrap().iter();
    roles.filter(|m| m["role"] == "assistant").count() <= 1
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
            // The golden answer of a later turn follows the dataset's earlier turns, which
            // regeneration replaces (see the next test).
            if !one_turn(case) {
                continue;
            }
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
fn every_assistant_turn_is_written_by_the_target_after_its_own_earlier_answers() {
    let preparer = Preparer::from_target_dir(&tiny_target(), None).unwrap();
    let (cases, _) = golden_rows();
    let case = cases
        .iter()
        .find(|c| !one_turn(c))
        .expect("a multi-turn case");
    let conv = case["messages"].as_array().unwrap();
    assert_eq!(
        conv.iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["system", "user", "assistant", "user", "assistant"]
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chat.jsonl");
    write_jsonl(&data, &[json!({"messages": conv})]);
    let out = dir.path().join("out.jsonl");
    let s = regenerate(backend(), &opts(&data, &out, 2, 12)).unwrap();
    assert_eq!((s.generated, s.turns), (1, 2), "{s}");
    let line = &read_out(&out)[0].1;
    let msgs = line["messages"].as_array().unwrap();
    assert_eq!(line["turns"], 2);
    assert_eq!(msgs.len(), 5);
    for k in [0, 1, 3] {
        assert_eq!(msgs[k], conv[k], "message {k} is the dataset's");
    }
    // Each answer is the target's greedy answer to the conversation before it, with the
    // target's own first answer in place of the dataset's.
    let mut turns = dflash_prepare::parse_conversation(&json!({"messages": msgs})).unwrap();
    let first = turns[2].content.clone();
    assert_ne!(
        json!(first),
        conv[2]["content"],
        "the first answer is regenerated"
    );
    turns[2].content = String::new();
    let prompt = |n: usize, turns: &[dflash_prepare::Message]| {
        dflash_regenerate::prompt::prompt_ids(&preparer, &turns[..n]).unwrap()
    };
    let first_prompt = prompt(2, &turns);
    turns[2].content = first.clone();
    let answers = generate_greedy(&[first_prompt, prompt(4, &turns)], 12, 2);
    let text = |ids: &[u32]| {
        let ids = ids.strip_suffix(&[257]).unwrap_or(ids);
        preparer.tokenizer().decode(ids, true).unwrap()
    };
    assert_eq!(first, text(&answers[0]));
    assert_eq!(msgs[4]["content"], text(&answers[1]));
    let new_tokens = answers.iter().map(Vec::len).sum::<usize>();
    assert_eq!(line["new_tokens"], new_tokens);
}

#[test]
fn answers_cut_by_max_new_tokens_drop_their_sample_unless_kept() {
    let (_, rows) = golden_rows();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chats.jsonl");
    write_jsonl(&data, &rows);
    let kept = dir.path().join("kept.jsonl");
    let all = regenerate(backend(), &opts(&data, &kept, 3, 16)).unwrap();
    let cut: Vec<u64> = read_out(&kept)
        .iter()
        .filter(|(_, l)| l["finish_reason"] != "eos")
        .map(|(i, _)| *i)
        .collect();
    assert!(!cut.is_empty() && cut.len() < 6, "{cut:?}");
    assert_eq!(all.finished_max_new_tokens, all.turns - all.finished_eos);

    let mut drop_cut = opts(&data, &dir.path().join("dropped.jsonl"), 3, 16);
    drop_cut.keep_truncated = false;
    let s = regenerate(backend(), &drop_cut).unwrap();
    assert_eq!(
        (s.generated, s.truncated),
        (6 - cut.len(), cut.len()),
        "{s}"
    );
    let skipped: Vec<u64> = s.skipped.iter().map(|(i, _)| *i).collect();
    assert_eq!(skipped, cut);
    assert!(
        s.skipped[0]
            .1
            .contains("cut by max_new_tokens at 16 tokens"),
        "{:?}",
        s.skipped
    );
    assert!(s.to_string().contains("--keep-truncated"), "{s}");
    let written: Vec<u64> = read_out(&drop_cut.out).iter().map(|r| r.0).collect();
    assert!(written.iter().all(|i| !cut.contains(i)), "{written:?}");
}

/// A Parquet file of `messages` rows (one user turn each).
fn write_parquet(path: &Path, users: &[&str]) {
    use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
    use arrow_array::{ArrayRef, RecordBatch};
    use arrow_schema::{DataType, Field, Fields, Schema};
    let fields = Fields::from(vec![
        Field::new("content", DataType::Utf8, true),
        Field::new("role", DataType::Utf8, true),
    ]);
    let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
    for content in users {
        let s = b.values();
        s.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value(content);
        s.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value("user");
        s.append(true);
        b.append(true);
    }
    let messages: ArrayRef = Arc::new(b.finish());
    let schema = Arc::new(Schema::new(vec![Field::new(
        "messages",
        messages.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(schema, vec![messages]).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn a_file_name_pattern_is_a_dataset_and_its_files_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        dir.path().join("train_sft-00000-of-00002.parquet"),
        dir.path().join("train_sft-00001-of-00002.parquet"),
    ];
    write_parquet(&files[0], &["def f():\n", "import os\n"]);
    write_parquet(&files[1], &["x"]);
    let out = dir.path().join("out.jsonl");
    let pattern = dir.path().join("train_sft-*.parquet");
    let s = regenerate(backend(), &opts(&pattern, &out, 3, 4)).unwrap();
    assert_eq!((s.samples, s.generated), (3, 3), "{s}");
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(dflash_regenerate::output::meta_path(&out)).unwrap(),
    )
    .unwrap();
    let canon: Vec<String> = files
        .iter()
        .map(|f| std::fs::canonicalize(f).unwrap().display().to_string())
        .collect();
    assert_eq!(meta["data"], json!(canon));
    // The same pattern continues the file.
    let s = regenerate(backend(), &opts(&pattern, &out, 3, 4)).unwrap();
    assert_eq!((s.resumed, s.generated), (3, 0));
}

#[test]
fn a_kv_cache_past_the_free_memory_is_refused_before_anything_is_written() {
    let (_, rows) = golden_rows();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chats.jsonl");
    write_jsonl(&data, &rows);
    let out = dir.path().join("out.jsonl");
    // 2^40 slots x 256 tokens x 4 KiB a token: no host has that.
    let e = regenerate(backend(), &opts(&data, &out, 1 << 40, 4)).unwrap_err();
    assert!(matches!(e, RegenerateError::Memory { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("--batch 1099511627776") && msg.contains("--capacity 256"),
        "{msg}"
    );
    assert!(!out.exists());
}

#[test]
fn the_default_capacity_is_bounded() {
    // Qwen3-8B: 4096 prompt tokens and the answer, not 40960 positions.
    assert_eq!(dflash_regenerate::default_capacity(40960, 1024), 5120);
    assert_eq!(dflash_regenerate::default_capacity(2048, 1024), 2048);
    let (_, rows) = golden_rows();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chats.jsonl");
    write_jsonl(&data, &rows[..1]);
    let out = dir.path().join("out.jsonl");
    let mut o = opts(&data, &out, 1, 4);
    o.capacity = None;
    regenerate(backend(), &o).unwrap();
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(dflash_regenerate::output::meta_path(&out)).unwrap(),
    )
    .unwrap();
    assert_eq!(
        meta["capacity"], 2048,
        "the tiny target's max_position_embeddings"
    );
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
        // The second turn's prompt holds the first answer and 300 more characters.
        json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "a".repeat(300)}]}),
    ];
    write_jsonl(&data, &rows);
    let out = dir.path().join("out.jsonl");
    let s = regenerate(backend(), &opts(&data, &out, 2, 4)).unwrap();
    assert_eq!((s.samples, s.generated), (6, 1));
    let reasons: Vec<(u64, &str)> = s.skipped.iter().map(|(i, r)| (*i, r.as_str())).collect();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
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
    assert!(
        reasons[4].0 == 5
            && reasons[4].1.starts_with("turn 2 of 2: the prompt has")
            && reasons[4].1.contains("capacity of 256"),
        "{reasons:?}"
    );

    write_jsonl(&data, &rows[1..]);
    let e = regenerate(backend(), &opts(&data, &dir.path().join("o2.jsonl"), 2, 4)).unwrap_err();
    assert!(
        matches!(e, RegenerateError::AllSkipped { total: 5, .. }),
        "{e}"
    );
}

//! `regenerate` on the embedded tiny target against HF transformers, end to end:
//! - `fixtures/generate_golden.json` (made by `fixtures/make_generate_golden.py`: HF
//!   `apply_chat_template` + greedy `generate`, float32 on the CPU, each conversation's
//!   final turn answered with its earlier turns as written): our prompt ids are HF's and our
//!   greedy answers to those prompts are HF's token for token; end to end, the one-turn
//!   conversations' answers are HF's at batch sizes 1, 2 and 6;
//! - a conversation of several assistant turns gets each written by the target in turn,
//!   conditioned on its own earlier answers;
//! - answers cut by `max_new_tokens` drop their sample unless `keep_truncated`, and a
//!   restart knows them dropped (generates nothing for them);
//! - a file-name pattern is a dataset; a KV cache past the free memory is refused.
//!
//! What a run drops and what a restart finds: `restart.rs`.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use dflash_models::Qwen3Target;
use dflash_models::generate::{GenerateOptions, Prompt, Sampling, generate};
use dflash_prepare::Preparer;
use dflash_regenerate::output::skipped_path;
use dflash_regenerate::{RegenerateError, regenerate};
use serde_json::{Value, json};

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

    // The drops are recorded beside the output: a restart neither generates them nor drops
    // them again, and says so.
    let record: Vec<Value> = std::fs::read_to_string(skipped_path(&drop_cut.out))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut recorded: Vec<u64> = record
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    recorded.sort();
    assert_eq!(recorded, cut);
    assert!(record.iter().all(|r| {
        r["reason"]
            .as_str()
            .unwrap()
            .contains("cut by max_new_tokens")
    }));
    let again = regenerate(backend(), &drop_cut).unwrap();
    assert_eq!(
        (
            again.generated,
            again.turns,
            again.resumed,
            again.resumed_skipped
        ),
        (0, 0, 6, cut.len()),
        "{again}"
    );
    assert!(again.skipped.is_empty() && again.truncated == 0, "{again}");
    let said = format!("6 already done ({} of them skipped before)", cut.len());
    assert!(again.to_string().contains(&said), "{again}");
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

/// The reference backend's tensors are host memory, which only Linux reports here.
#[cfg(target_os = "linux")]
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

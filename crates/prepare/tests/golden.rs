//! `dflash prepare` against HF transformers: golden input_ids and assistant masks made by
//! fixtures/make_golden.py from the real Qwen3 and Llama-3 tokenizer files and templates
//! (trimmed to the fixture texts and renumbered; `id_map` takes the trimmed ids back to the
//! real ones).

use std::path::{Path, PathBuf};

use dflash_prepare::{Input, Preparer, parse_sample};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn golden() -> Value {
    let text = std::fs::read_to_string(fixtures().join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn conversations() -> Vec<Value> {
    let input = Input::open(&fixtures().join("conversations.jsonl")).unwrap();
    let mut rows = Vec::new();
    input
        .for_each_chunk(3, &mut |chunk| {
            rows.extend(chunk.into_iter().map(|(_, v)| v));
            Ok(())
        })
        .unwrap();
    rows
}

fn ints(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Every fixture conversation through `preparer`, against transformers.
fn check(name: &str, preparer: &Preparer) {
    let g = &golden()["tokenizers"][name];
    let id_map = ints(&g["id_map"]);
    let samples = g["samples"].as_array().unwrap();
    let convs = conversations();
    assert_eq!(convs.len(), samples.len());
    for (sample, want) in convs.iter().zip(samples) {
        let i = want["index"].as_u64().unwrap();
        let msgs = parse_sample(sample).unwrap();
        let (text, _) = preparer.supervised_spans(&msgs).unwrap();
        assert_eq!(
            text,
            want["text"].as_str().unwrap(),
            "{name} sample {i}: rendering"
        );
        let p = preparer
            .prepare(&msgs)
            .unwrap_or_else(|e| panic!("{name} sample {i}: {e}"));
        let ids: Vec<u64> = p.ids.iter().map(|&t| id_map[t as usize]).collect();
        assert_eq!(
            ids,
            ints(&want["input_ids"]),
            "{name} sample {i}: input_ids"
        );
        let mask: Vec<u64> = p.loss_mask.iter().map(|&m| u64::from(m)).collect();
        assert_eq!(
            mask,
            ints(&want["assistant_masks"]),
            "{name} sample {i}: loss_mask vs assistant_masks"
        );
    }
}

#[test]
fn qwen3_real_template_matches_transformers() {
    let dir = fixtures().join("qwen3");
    let p = Preparer::from_target_dir(&dir, None).unwrap();
    assert!(!p.template().has_generation_blocks());
    check("qwen3", &p);
}

#[test]
fn qwen3_generation_template_matches_return_assistant_tokens_mask() {
    let dir = fixtures().join("qwen3");
    let p =
        Preparer::from_target_dir(&dir, Some(&dir.join("chat_template.generation.jinja"))).unwrap();
    assert!(p.template().has_generation_blocks());
    check("qwen3", &p);
}

#[test]
fn llama3_real_template_matches_transformers() {
    let dir = fixtures().join("llama3");
    let p = Preparer::from_target_dir(&dir, None).unwrap();
    check("llama3", &p);
}

#[test]
fn llama3_generation_template_matches_return_assistant_tokens_mask() {
    let dir = fixtures().join("llama3");
    let p =
        Preparer::from_target_dir(&dir, Some(&dir.join("chat_template.generation.jinja"))).unwrap();
    assert!(p.template().has_generation_blocks());
    check("llama3", &p);
}

#[test]
fn qwen3_empty_think_block_is_not_supervised_and_the_end_of_turn_is() {
    // Sample 0's single answer: the template inserts <think>\n\n</think>\n\n before it.
    let dir = fixtures().join("qwen3");
    let p = Preparer::from_target_dir(&dir, None).unwrap();
    let msgs = parse_sample(&conversations()[0]).unwrap();
    let (text, spans) = p.supervised_spans(&msgs).unwrap();
    assert!(text.contains("<think>\n\n</think>\n\n"), "{text:?}");
    assert_eq!(spans.len(), 1);
    // The answer through the token generation stops at; the newline after it is not generated.
    assert_eq!(
        &text[spans[0].clone()],
        "The capital of France is Paris.<|im_end|>"
    );
}

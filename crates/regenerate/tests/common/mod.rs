//! Helpers of the dflash-regenerate integration tests: the embedded tiny target on the
//! reference backend, the golden conversations, JSONL in and out.
// Each test binary uses a part of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dflash_core::Backend;
use dflash_core::registry::BackendOptions;
use dflash_models::generate::Sampling;
use dflash_regenerate::RegenerateOptions;
use serde_json::{Value, json};

pub fn tiny_target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-target")
}

pub fn golden() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/generate_golden.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

pub fn backend() -> Arc<dyn Backend> {
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

pub fn write_jsonl(path: &Path, rows: &[Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

pub fn opts(data: &Path, out: &Path, batch: usize, max_new: usize) -> RegenerateOptions {
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
pub fn read_out(path: &Path) -> Vec<(u64, Value)> {
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

pub fn golden_rows() -> (Vec<Value>, Vec<Value>) {
    let g = golden();
    let cases = g["cases"].as_array().unwrap().clone();
    let rows = cases
        .iter()
        .map(|c| json!({"messages": c["messages"]}))
        .collect();
    (cases, rows)
}

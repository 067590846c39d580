//! The ids that end a target's answer, read from its HF directory: one definition for every
//! loop that generates or measures generation (`dflash regenerate` stops a turn there,
//! evaluation stops a drafted sequence there), so that tau is measured on answers that end
//! where the target's own answers end.
//!
//! They are `generation_config.json`'s `eos_token_id` (what HF `generate` stops at), else
//! `config.json`'s, together with `tokenizer_config.json`'s `eos_token` (for chat models the
//! template's end of turn, e.g. `<|im_end|>`, which some targets leave out of both configs:
//! Qwen3-*-Base say `<|endoftext|>` while their chat turns end with `<|im_end|>`). An empty
//! list counts as absent. The `eos_token` string is resolved through `tokenizer.json` read as
//! JSON (added tokens first, then the model's vocabulary, the order `tokenizers` looks them
//! up in), so that this crate needs no tokenizer library.

use std::path::Path;

use dflash_config::Qwen3Config;
use serde_json::Value;

use crate::error::{ModelError, Result, io_err};

/// The target's end-of-answer ids, in order (generation/config ids, then the tokenizer's
/// `eos_token` if not among them). Empty when no file names one: what that means is the
/// caller's (an error for generation, no stop for evaluation). Files that are absent are
/// skipped; a file that is present but unreadable or malformed is an error naming it, as is
/// an `eos_token` that `tokenizer.json` does not hold.
pub fn eos_ids(dir: &Path, config: &Qwen3Config) -> Result<Vec<u32>> {
    let mut ids = generation_config_ids(&dir.join("generation_config.json"))?;
    if ids.is_empty() {
        ids = config_ids(config);
    }
    with_tokenizer_eos(dir, ids)
}

/// [`eos_ids`] for a caller that holds no parsed config (chat data preparation, whose target
/// may be any model): `config.json`'s `eos_token_id` is read from the file as JSON.
pub fn eos_ids_of_dir(dir: &Path) -> Result<Vec<u32>> {
    let mut ids = generation_config_ids(&dir.join("generation_config.json"))?;
    if ids.is_empty() {
        ids = generation_config_ids(&dir.join("config.json"))?;
    }
    with_tokenizer_eos(dir, ids)
}

/// `ids` with the tokenizer's `eos_token` appended where it is not among them.
fn with_tokenizer_eos(dir: &Path, mut ids: Vec<u32>) -> Result<Vec<u32>> {
    if let Some(id) = tokenizer_eos(dir)?
        && !ids.contains(&id)
    {
        ids.push(id);
    }
    Ok(ids)
}

/// `config.json`'s `eos_token_id` alone: the ids of a target that has no directory (random
/// weights of a given shape).
pub fn config_ids(config: &Qwen3Config) -> Vec<u32> {
    config
        .eos_token_id
        .as_ref()
        .map(|t| t.to_vec())
        .unwrap_or_default()
}

/// The files [`eos_ids`] consults, for messages that say where no id was found.
pub const EOS_FILES: [&str; 3] = [
    "generation_config.json",
    "config.json",
    "tokenizer_config.json",
];

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| bad_file(path, format!("not JSON: {e}")))
}

fn bad_file(path: &Path, detail: String) -> ModelError {
    ModelError::Checkpoint {
        path: path.to_path_buf(),
        detail,
    }
}

fn as_id(x: &Value) -> Option<u32> {
    x.as_u64().and_then(|x| u32::try_from(x).ok())
}

/// `eos_token_id` of `generation_config.json` (or of `config.json` read as JSON): one id or a
/// list (empty when absent).
fn generation_config_ids(path: &Path) -> Result<Vec<u32>> {
    let Some(v) = read_json(path)? else {
        return Ok(Vec::new());
    };
    let bad = || bad_file(path, "eos_token_id must be an id or a list of ids".into());
    match v.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(|x| as_id(x).ok_or_else(bad)).collect(),
        Some(x) => Ok(vec![as_id(x).ok_or_else(bad)?]),
    }
}

/// The id of `tokenizer_config.json`'s `eos_token` (a string, or an AddedToken object with
/// `content`), looked up in `tokenizer.json`.
fn tokenizer_eos(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join("tokenizer_config.json");
    let Some(v) = read_json(&path)? else {
        return Ok(None);
    };
    let bad = |detail: &str| bad_file(&path, format!("eos_token: {detail}"));
    let token = match v.get("eos_token") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => match o.get("content").and_then(Value::as_str) {
            Some(s) => s,
            None => return Err(bad("an object without a string \"content\"")),
        },
        Some(_) => return Err(bad("neither a string nor an object")),
    };
    let vocab_path = dir.join("tokenizer.json");
    let Some(tokenizer) = read_json(&vocab_path)? else {
        return Err(bad(&format!(
            "{token:?} cannot be resolved to an id: {} is missing",
            vocab_path.display()
        )));
    };
    token_id(&tokenizer, token)
        .map(Some)
        .ok_or_else(|| bad(&format!("{token:?} is not a token of tokenizer.json")))
}

/// The id of `token` in a `tokenizer.json`: its `added_tokens` (where special tokens such as
/// `<|im_end|>` live), then `model.vocab` (a token -> id map for BPE, WordPiece and
/// WordLevel; a list of `[piece, score]` for Unigram, where the id is the index).
fn token_id(tokenizer: &Value, token: &str) -> Option<u32> {
    let added = tokenizer.get("added_tokens").and_then(Value::as_array);
    if let Some(t) = added
        .into_iter()
        .flatten()
        .find(|t| t.get("content").and_then(Value::as_str) == Some(token))
    {
        return t.get("id").and_then(as_id);
    }
    match tokenizer.pointer("/model/vocab")? {
        Value::Object(m) => m.get(token).and_then(as_id),
        Value::Array(pieces) => pieces
            .iter()
            .position(|p| p.get(0).and_then(Value::as_str) == Some(token))
            .and_then(|i| u32::try_from(i).ok()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use dflash_config::TokenIds;

    fn tiny() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-target")
    }

    /// A target directory holding the tiny target's `tokenizer.json` and the given files.
    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            tiny().join("tokenizer.json"),
            dir.path().join("tokenizer.json"),
        )
        .unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    fn cfg(eos: Option<TokenIds>) -> Qwen3Config {
        let mut c = Qwen3Config::from_file(tiny().join("config.json")).unwrap();
        c.eos_token_id = eos;
        c
    }

    #[test]
    fn an_empty_generation_config_list_falls_back_to_config_json() {
        let d = dir_with(&[("generation_config.json", r#"{"eos_token_id": []}"#)]);
        let ids = eos_ids(d.path(), &cfg(Some(TokenIds::One(257)))).unwrap();
        assert_eq!(ids, [257]);
        let d = dir_with(&[("generation_config.json", r#"{"eos_token_id": [1, 2]}"#)]);
        let ids = eos_ids(d.path(), &cfg(Some(TokenIds::One(257)))).unwrap();
        assert_eq!(ids, [1, 2], "generation_config.json wins where it has ids");
    }

    /// A base target's shape: config.json ends at `<|endoftext|>` (257), the chat template's
    /// turns at `<|im_end|>` (259), named only by tokenizer_config.json.
    #[test]
    fn the_tokenizer_configs_eos_token_is_added() {
        let d = dir_with(&[
            ("generation_config.json", r#"{"eos_token_id": 257}"#),
            ("tokenizer_config.json", r#"{"eos_token": "<|im_end|>"}"#),
        ]);
        assert_eq!(eos_ids(d.path(), &cfg(None)).unwrap(), [257, 259]);
        let d = dir_with(&[("tokenizer_config.json", r#"{"eos_token": "<|im_end|>"}"#)]);
        assert_eq!(
            eos_ids(d.path(), &cfg(Some(TokenIds::One(257)))).unwrap(),
            [257, 259]
        );
        let d = dir_with(&[(
            "tokenizer_config.json",
            r#"{"eos_token": {"content": "<|im_end|>", "special": true}}"#,
        )]);
        assert_eq!(eos_ids(d.path(), &cfg(None)).unwrap(), [259]);
        let d = dir_with(&[("tokenizer_config.json", r#"{"eos_token": "<|nope|>"}"#)]);
        let e = eos_ids(d.path(), &cfg(None)).unwrap_err().to_string();
        assert!(e.contains("\"<|nope|>\" is not a token"), "{e}");
        assert!(e.contains("tokenizer_config.json"), "{e}");
    }

    #[test]
    fn vocabulary_tokens_resolve_through_model_vocab() {
        let t: Value = serde_json::from_str(
            r#"{"added_tokens": [{"id": 9, "content": "<e>"}],
                "model": {"vocab": {"a": 3, "<e>": 4}}}"#,
        )
        .unwrap();
        assert_eq!(token_id(&t, "<e>"), Some(9), "added tokens come first");
        assert_eq!(token_id(&t, "a"), Some(3));
        assert_eq!(token_id(&t, "b"), None);
        let unigram: Value =
            serde_json::from_str(r#"{"model": {"vocab": [["<s>", 0.0], ["</s>", 0.0]]}}"#).unwrap();
        assert_eq!(token_id(&unigram, "</s>"), Some(1));
    }

    #[test]
    fn malformed_files_are_errors_naming_them_and_absent_ones_give_nothing() {
        let d = dir_with(&[("generation_config.json", r#"{"eos_token_id": "x"}"#)]);
        let e = eos_ids(d.path(), &cfg(None)).unwrap_err().to_string();
        assert!(e.contains("generation_config.json"), "{e}");
        let d = dir_with(&[("tokenizer_config.json", "{")]);
        let e = eos_ids(d.path(), &cfg(None)).unwrap_err().to_string();
        assert!(e.contains("tokenizer_config.json: not JSON"), "{e}");
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("tokenizer_config.json"),
            r#"{"eos_token": "<|im_end|>"}"#,
        )
        .unwrap();
        let e = eos_ids(d.path(), &cfg(None)).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json is missing"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        assert!(eos_ids(empty.path(), &cfg(None)).unwrap().is_empty());
    }
}

//! The ids that end an answer: `generation_config.json`'s `eos_token_id` (what HF
//! `generate` stops at), else `config.json`'s, together with `tokenizer_config.json`'s
//! `eos_token` (for chat models the template's end of turn, e.g. `<|im_end|>`, which some
//! targets leave out of both configs). An empty list counts as absent; no id at all is an
//! error, since every answer would then run to `max_new_tokens`.

use std::path::Path;

use dflash_config::Qwen3Config;
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::error::{RegenerateError, io_err};

pub(crate) fn eos_ids(
    dir: &Path,
    cfg: &Qwen3Config,
    tokenizer: &Tokenizer,
) -> Result<Vec<u32>, RegenerateError> {
    let mut ids = generation_config_ids(&dir.join("generation_config.json"))?;
    if ids.is_empty() {
        ids = cfg
            .eos_token_id
            .as_ref()
            .map(|t| t.to_vec())
            .unwrap_or_default();
    }
    if let Some(id) = tokenizer_eos(&dir.join("tokenizer_config.json"), tokenizer)?
        && !ids.contains(&id)
    {
        ids.push(id);
    }
    if ids.is_empty() {
        return Err(RegenerateError::NoEos {
            consulted: [
                "generation_config.json",
                "config.json",
                "tokenizer_config.json",
            ]
            .iter()
            .map(|f| dir.join(f))
            .collect(),
        });
    }
    Ok(ids)
}

fn read_json(path: &Path) -> Result<Option<Value>, RegenerateError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| RegenerateError::Input(format!("{}: not JSON: {e}", path.display())))
}

/// `eos_token_id` of `generation_config.json`: one id or a list (empty when absent).
fn generation_config_ids(path: &Path) -> Result<Vec<u32>, RegenerateError> {
    let Some(v) = read_json(path)? else {
        return Ok(Vec::new());
    };
    let bad = || {
        RegenerateError::Input(format!(
            "{}: eos_token_id must be an id or a list of ids",
            path.display()
        ))
    };
    let id = |x: &Value| {
        x.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(bad)
    };
    match v.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(id).collect(),
        Some(x) => Ok(vec![id(x)?]),
    }
}

/// The id of `tokenizer_config.json`'s `eos_token` (a string, or an AddedToken object with
/// `content`); a token the tokenizer does not know is an error.
fn tokenizer_eos(path: &Path, tokenizer: &Tokenizer) -> Result<Option<u32>, RegenerateError> {
    let Some(v) = read_json(path)? else {
        return Ok(None);
    };
    let token = match v.get("eos_token") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => match o.get("content").and_then(Value::as_str) {
            Some(s) => s,
            None => {
                return Err(bad_eos_token(
                    path,
                    "an object without a string \"content\"",
                ));
            }
        },
        Some(_) => return Err(bad_eos_token(path, "neither a string nor an object")),
    };
    tokenizer
        .token_to_id(token)
        .map(Some)
        .ok_or_else(|| bad_eos_token(path, &format!("{token:?} is not a token of tokenizer.json")))
}

fn bad_eos_token(path: &Path, detail: &str) -> RegenerateError {
    RegenerateError::Input(format!("{}: eos_token: {detail}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    use dflash_config::TokenIds;

    fn tiny() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-target")
    }

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_file(tiny().join("tokenizer.json")).unwrap()
    }

    /// A target directory holding only the given files.
    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
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
        let ids = eos_ids(d.path(), &cfg(Some(TokenIds::One(257))), &tokenizer()).unwrap();
        assert_eq!(ids, [257]);
        let d = dir_with(&[("generation_config.json", r#"{"eos_token_id": [1, 2]}"#)]);
        let ids = eos_ids(d.path(), &cfg(Some(TokenIds::One(257))), &tokenizer()).unwrap();
        assert_eq!(ids, [1, 2], "generation_config.json wins where it has ids");
    }

    #[test]
    fn the_tokenizer_configs_eos_token_is_added() {
        let d = dir_with(&[
            ("generation_config.json", r#"{"eos_token_id": 257}"#),
            ("tokenizer_config.json", r#"{"eos_token": "<|im_end|>"}"#),
        ]);
        assert_eq!(
            eos_ids(d.path(), &cfg(None), &tokenizer()).unwrap(),
            [257, 259]
        );
        let d = dir_with(&[(
            "tokenizer_config.json",
            r#"{"eos_token": {"content": "<|im_end|>", "special": true}}"#,
        )]);
        assert_eq!(eos_ids(d.path(), &cfg(None), &tokenizer()).unwrap(), [259]);
        let d = dir_with(&[("tokenizer_config.json", r#"{"eos_token": "<|nope|>"}"#)]);
        let e = eos_ids(d.path(), &cfg(None), &tokenizer()).unwrap_err();
        assert!(e.to_string().contains("\"<|nope|>\" is not a token"), "{e}");
    }

    #[test]
    fn no_eos_anywhere_is_an_error_naming_the_files() {
        let d = dir_with(&[
            ("generation_config.json", r#"{"eos_token_id": []}"#),
            ("tokenizer_config.json", r#"{"eos_token": null}"#),
        ]);
        let e = eos_ids(d.path(), &cfg(None), &tokenizer()).unwrap_err();
        assert!(matches!(e, RegenerateError::NoEos { .. }), "{e}");
        let msg = e.to_string();
        for f in [
            "generation_config.json",
            "config.json",
            "tokenizer_config.json",
        ] {
            assert!(msg.contains(f), "{msg}");
        }
    }
}

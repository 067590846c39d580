//! The ids that end an answer: [`dflash_models::eos::eos_ids`], the definition evaluation
//! shares (so that the drafter is measured on answers that end where regenerated ones do).
//! For generation no id at all is an error, since every answer would then run to
//! `max_new_tokens`.

use std::path::Path;

use dflash_config::Qwen3Config;
use dflash_models::eos::EOS_FILES;

use crate::error::RegenerateError;

pub(crate) fn eos_ids(dir: &Path, cfg: &Qwen3Config) -> Result<Vec<u32>, RegenerateError> {
    let ids = dflash_models::eos::eos_ids(dir, cfg)?;
    if ids.is_empty() {
        return Err(RegenerateError::NoEos {
            consulted: EOS_FILES.iter().map(|f| dir.join(f)).collect(),
        });
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    use dflash_config::TokenIds;

    fn tiny() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-target")
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

    /// The shared definition's cases (generation_config.json over config.json, the
    /// tokenizer's `eos_token` added, unknown tokens refused) are tested in dflash-models;
    /// here, only that generation goes through it.
    #[test]
    fn the_tokenizer_configs_eos_token_is_added() {
        let d = dir_with(&[
            ("generation_config.json", r#"{"eos_token_id": 257}"#),
            ("tokenizer_config.json", r#"{"eos_token": "<|im_end|>"}"#),
        ]);
        std::fs::copy(
            tiny().join("tokenizer.json"),
            d.path().join("tokenizer.json"),
        )
        .unwrap();
        assert_eq!(eos_ids(d.path(), &cfg(None)).unwrap(), [257, 259]);
        std::fs::write(
            d.path().join("tokenizer_config.json"),
            r#"{"eos_token": "<|nope|>"}"#,
        )
        .unwrap();
        let e = eos_ids(d.path(), &cfg(None)).unwrap_err();
        assert!(e.to_string().contains("\"<|nope|>\" is not a token"), "{e}");
    }

    #[test]
    fn no_eos_anywhere_is_an_error_naming_the_files() {
        let d = dir_with(&[
            ("generation_config.json", r#"{"eos_token_id": []}"#),
            ("tokenizer_config.json", r#"{"eos_token": null}"#),
        ]);
        let e = eos_ids(d.path(), &cfg(None)).unwrap_err();
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

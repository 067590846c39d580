//! The end-of-turn token each assistant turn is supervised through: read from the target
//! directory as generation reads its stop ids, found in what the template renders after the
//! content, and left out where the template renders none.

use std::path::{Path, PathBuf};

use dflash_prepare::end_of_turn::end_of_turn_tokens;
use dflash_prepare::{ChatTemplate, Message, Preparer, Role};
use tokenizers::Tokenizer;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn tokenizer(dir: &Path) -> Tokenizer {
    Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
}

fn conversation() -> Vec<Message> {
    [
        (Role::User, "Capital of France?"),
        (Role::Assistant, "Paris."),
    ]
    .into_iter()
    .map(|(role, c)| Message {
        role,
        content: c.into(),
    })
    .collect()
}

/// The supervised text of the conversation's one turn.
fn supervised(p: &Preparer) -> String {
    let (text, spans) = p.supervised_spans(&conversation()).unwrap();
    assert_eq!(spans.len(), 1, "{text:?}");
    text[spans[0].clone()].to_string()
}

#[test]
fn the_fixture_targets_end_their_turns_with_their_generation_config_ids() {
    for (name, want) in [
        ("qwen3", ["<|im_end|>", "<|endoftext|>"]),
        ("llama3", ["<|end_of_text|>", "<|eot_id|>"]),
    ] {
        let dir = fixtures().join(name);
        assert_eq!(
            end_of_turn_tokens(&dir, &tokenizer(&dir)).unwrap(),
            want,
            "{name}"
        );
        let p = Preparer::from_target_dir(&dir, None).unwrap();
        assert_eq!(p.end_of_turn(), want, "{name}");
    }
}

/// A copy of the Qwen3 fixture's tokenizer files, without its generation_config.json.
fn bare_target() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixtures().join("qwen3").join(f), tmp.path().join(f)).unwrap();
    }
    tmp
}

#[test]
fn config_json_stands_in_for_a_missing_generation_config_and_the_tokenizer_eos_joins() {
    let dir = bare_target();
    let tok = tokenizer(dir.path());
    assert_eq!(
        end_of_turn_tokens(dir.path(), &tok).unwrap(),
        ["<|im_end|>"]
    );
    let endoftext = tok.token_to_id("<|endoftext|>").unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        format!(r#"{{"eos_token_id": {endoftext}}}"#),
    )
    .unwrap();
    assert_eq!(
        end_of_turn_tokens(dir.path(), &tok).unwrap(),
        ["<|endoftext|>", "<|im_end|>"]
    );
}

#[test]
fn a_bad_eos_token_id_is_an_error_naming_the_file() {
    let dir = bare_target();
    let tok = tokenizer(dir.path());
    for (body, says) in [
        (r#"{"eos_token_id": 999999}"#, "999999 is not a token"),
        (
            r#"{"eos_token_id": ["<|im_end|>"]}"#,
            "an id or a list of ids",
        ),
        ("{not json", "not JSON"),
    ] {
        std::fs::write(dir.path().join("generation_config.json"), body).unwrap();
        let e = end_of_turn_tokens(dir.path(), &tok)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("generation_config.json") && e.contains(says),
            "{body}: {e}"
        );
        assert!(
            Preparer::from_target_dir(dir.path(), None).is_err(),
            "{body}"
        );
    }
}

#[test]
fn a_turn_is_supervised_through_its_end_token_only_where_the_template_renders_one() {
    let dir = fixtures().join("qwen3");
    let with = Preparer::from_target_dir(&dir, None).unwrap();
    assert_eq!(supervised(&with), "Paris.<|im_end|>");
    // No end-of-turn tokens known: the content alone.
    let without = Preparer::new(
        ChatTemplate::from_target_dir(&dir).unwrap(),
        tokenizer(&dir),
    );
    assert_eq!(supervised(&without), "Paris.");
    // A template that renders no end token after the content: the content alone.
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain.jinja");
    std::fs::write(
        &plain,
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}\
         {% if add_generation_prompt %}<assistant>{% endif %}",
    )
    .unwrap();
    let p = Preparer::from_target_dir(&dir, Some(&plain)).unwrap();
    assert_eq!(p.end_of_turn(), ["<|im_end|>", "<|endoftext|>"]);
    assert_eq!(supervised(&p), "Paris.");
    // Text between the content and the token is generated too: supervised with it.
    let spaced = tmp.path().join("spaced.jinja");
    std::fs::write(
        &spaced,
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<assistant>{% endif %}",
    )
    .unwrap();
    let p = Preparer::from_target_dir(&dir, Some(&spaced)).unwrap();
    assert_eq!(supervised(&p), "Paris.\n<|im_end|>");
}

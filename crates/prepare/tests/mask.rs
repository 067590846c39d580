//! Loss masks of short replies that also occur in the role headers and end-of-turn tokens the
//! templates render (`a` in `<|im_start|>assistant`, `d` in `<|eot_id|>`, `start` and `end` in
//! the special tokens), with the fixture templates and a byte-level tokenizer that covers every
//! byte (one token per byte), so every supervised byte shows in the mask. Each turn is
//! supervised through its end-of-turn token (the generation templates hold it in their blocks).

use std::path::{Path, PathBuf};

use dflash_prepare::{ChatTemplate, Message, Preparer, Role, SkipReason};
use tokenizers::Tokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A byte-level BPE without merges: the 256 byte characters, nothing else.
fn byte_tokenizer() -> Tokenizer {
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort();
    assert_eq!(alphabet.len(), 256);
    let vocab: serde_json::Map<String, serde_json::Value> = alphabet
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), serde_json::json!(i)))
        .collect();
    let byte_level = serde_json::json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true
    });
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": []
        }
    });
    json.to_string().parse().unwrap()
}

fn preparers() -> Vec<(String, Preparer)> {
    let mut out = Vec::new();
    for name in ["qwen3", "llama3"] {
        let dir = fixtures().join(name);
        let real = ChatTemplate::from_target_dir(&dir).unwrap();
        let generation =
            ChatTemplate::from_target_dir_with(&dir, &dir.join("chat_template.generation.jinja"))
                .unwrap();
        assert!(!real.has_generation_blocks() && generation.has_generation_blocks());
        let eot = vec![eot(name).to_string()];
        out.push((
            name.to_string(),
            Preparer::new(real, byte_tokenizer()).with_end_of_turn(eot.clone()),
        ));
        out.push((
            format!("{name} with generation blocks"),
            Preparer::new(generation, byte_tokenizer()).with_end_of_turn(eot),
        ));
    }
    out
}

/// The token that ends an assistant turn of the fixture `name` (a preparer's name starts with it).
fn eot(name: &str) -> &'static str {
    if name.starts_with("qwen3") {
        "<|im_end|>"
    } else {
        "<|eot_id|>"
    }
}

fn conversation(turns: &[(Role, &str)]) -> Vec<Message> {
    turns
        .iter()
        .map(|&(role, c)| Message {
            role,
            content: c.into(),
        })
        .collect()
}

/// The decoded runs of consecutive supervised tokens.
fn supervised_runs(p: &Preparer, msgs: &[Message]) -> Vec<String> {
    runs_of(p, &p.prepare(msgs).unwrap())
}

fn runs_of(p: &Preparer, prepared: &dflash_prepare::Prepared) -> Vec<String> {
    let mut runs: Vec<Vec<u32>> = Vec::new();
    let mut open = false;
    for (&id, &m) in prepared.ids.iter().zip(&prepared.loss_mask) {
        match (m, open) {
            (1, true) => runs.last_mut().unwrap().push(id),
            (1, false) => runs.push(vec![id]),
            _ => {}
        }
        open = m == 1;
    }
    runs.iter()
        .map(|r| p.tokenizer().decode(r, false).unwrap())
        .collect()
}

#[test]
fn short_replies_are_supervised_where_they_are_not_in_a_role_header() {
    use Role::{Assistant as A, User as U};
    let cases: [&[(Role, &str)]; 2] = [
        &[
            (U, "Pick a or b."),
            (A, "a"),
            (U, "Why?"),
            (A, "It is first."),
        ],
        &[
            (U, "Letter after c?"),
            (A, "d"),
            (U, "Opposite of finish?"),
            (A, "start"),
            (U, "And of begin?"),
            (A, "end"),
        ],
    ];
    for (name, p) in preparers() {
        for case in cases {
            let msgs = conversation(case);
            let replies: Vec<String> = case
                .iter()
                .filter(|(r, _)| *r == Role::Assistant)
                .map(|(_, c)| format!("{c}{}", eot(&name)))
                .collect();
            let (text, spans) = p.supervised_spans(&msgs).unwrap();
            let texts: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
            assert_eq!(texts, replies, "{name}: spans in {text:?}");
            assert_eq!(
                supervised_runs(&p, &msgs),
                replies,
                "{name}: masked tokens of {text:?}"
            );
        }
    }
}

#[test]
fn a_conversation_without_an_assistant_turn_is_skipped_not_a_panic() {
    let msgs = conversation(&[(Role::User, "Pick a or b.")]);
    for (name, p) in preparers() {
        assert_eq!(
            p.prepare(&msgs),
            Err(SkipReason::NoAssistant),
            "{name}: prepare"
        );
        assert_eq!(
            p.supervised_spans(&msgs),
            Err(SkipReason::NoAssistant),
            "{name}: supervised_spans"
        );
    }
}

/// The byte ranges of the supervised tokens (one token per byte: ASCII text).
fn supervised_ranges(p: &Preparer, msgs: &[Message]) -> Vec<std::ops::Range<usize>> {
    let mask = p.prepare(msgs).unwrap().loss_mask;
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, _) in mask.iter().enumerate().filter(|(_, m)| **m == 1) {
        match out.last_mut() {
            Some(r) if r.end == i => r.end += 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// Replies that also occur in the `<think>\n\n</think>\n\n` Qwen3 inserts before the last
/// turn's content (after the text it shares with the generation prompt): the reply, right
/// before its end-of-turn token, is supervised, never the inserted block.
#[test]
fn replies_inside_an_inserted_think_block_are_supervised_where_the_content_is() {
    use Role::{Assistant as A, User as U};
    let cases: [&[(Role, &str)]; 7] = [
        &[(U, "Say hi"), (A, "hi")],
        &[(U, "Preposition?"), (A, "in")],
        &[(U, "Letter after j?"), (A, "k")],
        &[(U, "Verb?"), (A, "think")],
        &[(U, "Close a tag."), (A, "</")],
        &[
            (U, "Hello"),
            (A, "Hello! How can I help?"),
            (U, "Say hi"),
            (A, "hi"),
        ],
        &[(U, "Say hi"), (A, "hi"), (U, "Again"), (A, "hi")],
    ];
    for (name, p) in preparers() {
        for case in cases {
            let msgs = conversation(case);
            let text = p.supervised_spans(&msgs).unwrap().0;
            assert!(text.is_ascii());
            // Each reply is the last occurrence of it with an end-of-turn token after it
            // before the next reply.
            let mut end = text.len();
            let mut want: Vec<std::ops::Range<usize>> = case
                .iter()
                .rev()
                .filter(|(r, _)| *r == Role::Assistant)
                .map(|(_, c)| {
                    let at = ["<|im_end|>", "<|eot_id|>"]
                        .iter()
                        .find_map(|eot| text[..end].rfind(&format!("{c}{eot}")))
                        .unwrap();
                    end = at;
                    at..at + c.len() + eot(&name).len()
                })
                .collect();
            want.reverse();
            assert_eq!(
                supervised_ranges(&p, &msgs),
                want,
                "{name}: masked bytes of {text:?}"
            );
        }
    }
}

/// A reply with reasoning keeps its reasoning and answer supervised where Qwen3 re-renders
/// them, also when the reasoning (`hi`) or the answer (`k`) occurs in the tags.
#[test]
fn reasoning_that_is_a_word_of_the_tags_is_supervised_from_the_reasoning_on() {
    use Role::{Assistant as A, User as U};
    let msgs = conversation(&[(U, "q"), (A, "<think>\nhi\n\n</think>\nk")]);
    for (name, p) in preparers() {
        // Qwen3's generation blocks hold the re-rendered `<think>` too.
        let want = match name.as_str() {
            "qwen3" => "hi\n</think>\n\nk",
            "qwen3 with generation blocks" => "<think>\nhi\n</think>\n\nk",
            _ => "<think>\nhi\n\n</think>\nk",
        };
        let want = format!("{want}{}", eot(&name));
        let (text, _) = p.supervised_spans(&msgs).unwrap();
        assert_eq!(
            supervised_runs(&p, &msgs),
            [want],
            "{name}: masked tokens of {text:?}"
        );
    }
}

/// An earlier turn whose reasoning Qwen3 drops when rendering it, and whose reasoning also
/// matches where its answer does: its answer is found in its own turn, not past a later
/// turn's `</think>` (a span across turns, which the cross-check refused: the sample was lost).
#[test]
fn a_dropped_reasoning_does_not_pull_the_answer_into_a_later_turn() {
    use Role::{Assistant as A, User as U};
    let msgs = conversation(&[
        (U, "q1"),
        (A, "<think>ok</think>ok then"),
        (U, "q2"),
        (A, "<think>r2</think>ok then"),
    ]);
    for (name, p) in preparers() {
        let runs = supervised_runs(&p, &msgs);
        assert_eq!(runs.len(), 2, "{name}: {runs:?}");
        if name == "qwen3" {
            assert_eq!(runs[0], "ok then<|im_end|>", "{name}");
            assert!(
                runs[1].starts_with("r2") && runs[1].ends_with("ok then<|im_end|>"),
                "{name}: {runs:?}"
            );
        }
    }
}

/// `reasoning_content` (vLLM / SGLang with a reasoning parser) reaches the template: Qwen3
/// renders it in the `<think>` block instead of an empty one, and it is supervised with the
/// answer, as a `<think>` block written in the content is.
#[test]
fn reasoning_content_is_rendered_and_supervised() {
    let sample = serde_json::json!({"messages": [
        {"role": "user", "content": "Is water wet?"},
        {"role": "assistant", "content": "Yes.", "reasoning_content": "Water wets things.\n"}]});
    let msgs = dflash_prepare::parse_sample(&sample).unwrap();
    let inline = conversation(&[
        (Role::User, "Is water wet?"),
        (
            Role::Assistant,
            "<think>\nWater wets things.\n</think>\n\nYes.",
        ),
    ]);
    for (name, p) in preparers() {
        let (text, _) = p.supervised_spans(&msgs).unwrap();
        let runs = supervised_runs(&p, &msgs);
        assert_eq!(runs.len(), 1, "{name}: {runs:?}");
        assert!(
            runs[0].contains("Water wets things.")
                && runs[0].ends_with(&format!("Yes.{}", eot(&name))),
            "{name}: masked tokens {runs:?} of {text:?}"
        );
        if name.starts_with("qwen3") {
            assert!(
                text.contains("<think>\nWater wets things.\n</think>\n\nYes.<|im_end|>"),
                "{name}: {text:?}"
            );
            // The same rendering and mask as the reasoning written in the content.
            assert_eq!(p.prepare(&msgs), p.prepare(&inline), "{name}");
        }
    }
}

/// Qwen3 drops the reasoning of every assistant turn before the last user message, so the
/// whole conversation keeps only the first turn's answer: an extra sample ends with that turn,
/// its reasoning rendered, and supervises that turn alone.
#[test]
fn an_earlier_turns_dropped_reasoning_is_supervised_in_an_extra_sample() {
    use Role::{Assistant as A, User as U};
    let msgs = conversation(&[
        (U, "q1"),
        (A, "<think>\nlong reasoning one\n</think>\n\nA1"),
        (U, "q2"),
        (A, "<think>\nreasoning two\n</think>\n\nA2"),
    ]);
    for (name, p) in preparers() {
        let c = p.prepare_conversation(&msgs).unwrap();
        assert_eq!(c.samples[0], p.prepare(&msgs).unwrap(), "{name}");
        assert_eq!(c.reasoning_dropped, 0, "{name}");
        let runs: Vec<Vec<String>> = c.samples.iter().map(|s| runs_of(&p, s)).collect();
        assert!(
            runs.iter()
                .flatten()
                .any(|r| r.contains("long reasoning one")),
            "{name}: {runs:?}"
        );
        if name.starts_with("qwen3") {
            assert_eq!(c.samples.len(), 2, "{name}: {runs:?}");
            assert!(
                !runs[0][0].contains("long reasoning one"),
                "{name}: {runs:?}"
            );
            assert_eq!(runs[1].len(), 1, "{name}: {runs:?}");
            assert!(
                runs[1][0].ends_with("long reasoning one\n</think>\n\nA1<|im_end|>"),
                "{name}"
            );
        } else {
            // Llama 3 renders the content as written, reasoning included.
            assert_eq!(c.samples.len(), 1, "{name}: {runs:?}");
        }
    }
}

/// A template that never renders the reasoning: no extra sample can hold it, and the turns
/// are counted rather than lost silently.
#[test]
fn reasoning_no_template_rendering_holds_is_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let template = tmp.path().join("no_reasoning.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}<{{ m.role }}>{{ m.content.split('</think>')[-1] }}</{{ m.role }}>\
         {% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    )
    .unwrap();
    let dir = fixtures().join("qwen3");
    let p = Preparer::new(
        ChatTemplate::from_target_dir_with(&dir, &template).unwrap(),
        byte_tokenizer(),
    );
    use Role::{Assistant as A, User as U};
    let msgs = conversation(&[
        (U, "q1"),
        (A, "<think>\nr1\n</think>\n\nA1"),
        (U, "q2"),
        (A, "<think>\nr2\n</think>\n\nA2"),
    ]);
    let c = p.prepare_conversation(&msgs).unwrap();
    assert_eq!((c.samples.len(), c.reasoning_dropped), (1, 2));
}

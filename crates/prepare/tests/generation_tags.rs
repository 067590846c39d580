//! `{% generation %}` tags are rewritten only where they are statements, and the rewrite adds
//! nothing to the template's text: the tags' text in comments, `{% raw %}` blocks and string
//! literals stays text, and whitespace at the start of a template is trimmed as in the same
//! template without the tags (as transformers renders it).

use std::path::{Path, PathBuf};

use dflash_prepare::{ChatTemplate, Message, Preparer, Role, parse_sample};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(source, vec![("bos_token", "<s>".into())], "t".into()).unwrap()
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

fn fixture_conversations() -> Vec<Vec<Message>> {
    std::fs::read_to_string(fixtures().join("conversations.jsonl"))
        .unwrap()
        .lines()
        .map(|l| parse_sample(&serde_json::from_str(l).unwrap()).unwrap())
        .collect()
}

/// The chat template in a fixture's `tokenizer_config.json`.
fn config_template(name: &str) -> String {
    let path = fixtures().join(name).join("tokenizer_config.json");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    config["chat_template"].as_str().unwrap().to_string()
}

fn without_tags(source: &str) -> String {
    source
        .replace("{% generation %}", "")
        .replace("{% endgeneration %}", "")
}

#[test]
fn generation_tag_in_a_comment_leaves_the_template_plain() {
    // Were the commented tag taken for a generation block, every sample would be skipped
    // ("generation blocks rendered 0 spans").
    let dir = fixtures().join("qwen3");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("chat_template.jinja");
    let plain = config_template("qwen3");
    std::fs::write(
        &file,
        format!("{{# wrap answers in {{% generation %}}...{{% endgeneration %}} #}}{plain}"),
    )
    .unwrap();
    let commented = Preparer::from_target_dir(&dir, Some(&file)).unwrap();
    let reference = Preparer::from_target_dir(&dir, None).unwrap();
    assert!(!commented.template().has_generation_blocks());
    for (i, msgs) in fixture_conversations().iter().enumerate() {
        let got = commented
            .prepare(msgs)
            .unwrap_or_else(|e| panic!("sample {i}: {e}"));
        let want = reference.prepare(msgs).unwrap();
        assert_eq!(got.ids, want.ids, "sample {i}: input_ids");
        assert_eq!(got.loss_mask, want.loss_mask, "sample {i}: loss_mask");
    }
}

#[test]
fn generation_tags_change_no_whitespace_at_the_start_of_a_template() {
    let msgs = conversation(&[(Role::User, "hi"), (Role::Assistant, "yo")]);
    let body = "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}\
                {% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}\
                {% endif %}|{% endfor %}";
    // trim_blocks keeps a newline that precedes the first tag; lstrip_blocks removes spaces
    // before a block tag at the start of the template.
    for (lead, want) in [
        ("\n", "\nuser: hi|assistant: yo|"),
        ("  ", "user: hi|assistant: yo|"),
        ("\n  ", "\nuser: hi|assistant: yo|"),
        ("{{ bos_token }}\n", "<s>\nuser: hi|assistant: yo|"),
    ] {
        let source = format!("{lead}{body}");
        let with = template(&source);
        let plain = template(&without_tags(&source));
        assert!(with.has_generation_blocks() && !plain.has_generation_blocks());
        let r = with.render(&msgs, false).unwrap();
        assert_eq!(r.text, plain.render(&msgs, false).unwrap().text, "{lead:?}");
        assert_eq!(r.text, want, "{lead:?}");
        let spans: Vec<&str> = r.generation.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(spans, ["yo"], "{lead:?}");
    }

    // The fixture generation templates behind a leading newline, against the same templates
    // without the tags (the tags themselves render nothing).
    for name in ["qwen3", "llama3"] {
        let path = fixtures().join(name).join("chat_template.generation.jinja");
        let source = format!("\n{}", std::fs::read_to_string(path).unwrap());
        let with = template(&source);
        let plain = template(&without_tags(&source));
        assert!(with.has_generation_blocks() && !plain.has_generation_blocks());
        for (i, msgs) in fixture_conversations().iter().enumerate() {
            for prompt in [false, true] {
                assert_eq!(
                    with.render(msgs, prompt).unwrap().text,
                    plain.render(msgs, prompt).unwrap().text,
                    "{name} sample {i}, add_generation_prompt={prompt}"
                );
            }
        }
    }
}

#[test]
fn generation_tags_in_raw_blocks_and_strings_stay_text() {
    let msgs = conversation(&[(Role::User, "hi")]);
    let t = template(
        "{% raw %}a{% generation %}b{%- endgeneration -%}{% endraw %}|\
         {%- raw -%} {% generation %} {%+ endraw %}|\
         {{ '{% generation %}' ~ \"{% endgeneration %}\" }}|\
         {% set s = 'it\\'s {% generation %}' %}{{ s }}|\
         {{ {'k': '{% generation %}'}['k'] }}",
    );
    assert!(!t.has_generation_blocks());
    let r = t.render(&msgs, false).unwrap();
    assert_eq!(
        r.text,
        "a{% generation %}b{%- endgeneration -%}|{% generation %} |\
         {% generation %}{% endgeneration %}|it's {% generation %}|{% generation %}"
    );
    assert!(r.generation.is_empty());

    // Real tags after the raw block, a comment and strings are still found.
    let t = template(
        "{# {% generation %} #}{% raw %}{% endgeneration %}{% endraw %}\
         {{ '%}' }}{% generation %}{{ messages[0].content }}{% endgeneration %}",
    );
    assert!(t.has_generation_blocks());
    let r = t.render(&msgs, false).unwrap();
    assert_eq!(r.text, "{% endgeneration %}%}hi");
    let spans: Vec<&str> = r.generation.iter().map(|s| &r.text[s.clone()]).collect();
    assert_eq!(spans, ["hi"]);
}

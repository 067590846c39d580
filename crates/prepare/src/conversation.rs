//! One sample's conversation, from OpenAI `messages` (`role`, `content`) or ShareGPT
//! `conversations` (`from`, `value`), with an optional top-level `system` prompt.
//!
//! An assistant message's `reasoning_content` (what vLLM and SGLang write with a reasoning
//! parser; `reasoning` in newer vLLM) is folded into its content as
//! `<think>\n{reasoning}\n</think>\n\n{content}`. Templates that read `reasoning_content`
//! (Qwen3) split a `<think>` block out of the content the same way and render the same text,
//! and the masks already supervise a `<think>` block from its reasoning on; keeping it in
//! `content` also keeps [`Message`] two fields, so code that rewrites a turn's content
//! (regeneration) replaces its reasoning with it rather than leaving a stale one behind.

use serde_json::Value;

use crate::error::SkipReason;

/// A message with its role normalised to `system`, `user`, `assistant` or `tool` (the names
/// chat templates test for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// The role names found in OpenAI and ShareGPT-style data (ShareGPT exports name the
    /// assistant after the model that answered).
    pub fn parse(name: &str) -> Option<Role> {
        Some(match name.trim().to_ascii_lowercase().as_str() {
            "system" => Role::System,
            "user" | "human" => Role::User,
            "assistant" | "gpt" | "chatgpt" | "bard" | "bing" | "model" => Role::Assistant,
            "tool" | "function" | "observation" | "ipython" => Role::Tool,
            _ => return None,
        })
    }
}

/// The conversation of one sample (a JSON object, or a row converted to one), which must
/// hold an assistant turn to supervise.
pub fn parse_sample(sample: &Value) -> Result<Vec<Message>, SkipReason> {
    let out = parse_conversation(sample)?;
    if !out.iter().any(|m| m.role == Role::Assistant) {
        return Err(SkipReason::NoAssistant);
    }
    Ok(out)
}

/// As [`parse_sample`], without requiring an assistant turn (prompts to answer).
pub fn parse_conversation(sample: &Value) -> Result<Vec<Message>, SkipReason> {
    let (list, role_key, content_key) = match (sample.get("messages"), sample.get("conversations"))
    {
        (Some(m), _) if !m.is_null() => (m, "role", "content"),
        (_, Some(c)) if !c.is_null() => (c, "from", "value"),
        _ => return Err(SkipReason::NoConversation),
    };
    let list = list.as_array().ok_or_else(|| SkipReason::Malformed {
        message: 0,
        detail: format!("the conversation is a {}, expected a list", kind(list)),
    })?;
    if list.is_empty() {
        return Err(SkipReason::NoConversation);
    }
    let mut out = Vec::with_capacity(list.len() + 1);
    // The top-level `system` (ShareGPT exports) stands in for a missing system message; a
    // conversation's own first system message wins over it.
    let mut prepended = false;
    if let Some(system) = sample.get("system").and_then(Value::as_str)
        && !system.trim().is_empty()
    {
        out.push(Message {
            role: Role::System,
            content: system.to_string(),
        });
        prepended = true;
    }
    for (k, m) in list.iter().enumerate() {
        let bad = |detail: String| SkipReason::Malformed { message: k, detail };
        let obj = m
            .as_object()
            .ok_or_else(|| bad(format!("a {}, expected an object", kind(m))))?;
        // Mixed exports: accept either key pair in either format.
        let role = obj
            .get(role_key)
            .or_else(|| obj.get(if role_key == "role" { "from" } else { "role" }))
            .ok_or_else(|| bad(format!("no {role_key:?}")))?;
        let role_name = role.as_str().ok_or_else(|| {
            bad(format!(
                "{role_key:?} is a {}, expected a string",
                kind(role)
            ))
        })?;
        let role = Role::parse(role_name).ok_or_else(|| {
            bad(format!(
                "unknown role {role_name:?} (expected system, user/human, assistant/gpt or tool)"
            ))
        })?;
        let content = obj
            .get(content_key)
            .or_else(|| {
                obj.get(if content_key == "content" {
                    "value"
                } else {
                    "content"
                })
            })
            .ok_or_else(|| bad(format!("no {content_key:?}")))?;
        let content = text_of(content).ok_or_else(|| {
            bad(format!(
                "{content_key:?} is a {}, expected a string or a list of text parts",
                kind(content)
            ))
        })?;
        if role == Role::System && k == 0 && prepended {
            out.clear();
        } else if role == Role::System && !out.is_empty() {
            return Err(bad("a system message after the first message".into()));
        }
        let content = match reasoning_of(obj).map_err(bad)? {
            Some(r) if role == Role::Assistant => {
                if content.contains("</think>") {
                    // The template would render both, the field's block before the content's.
                    return Err(bad(
                        "both a reasoning_content and a <think> block in the content".into(),
                    ));
                }
                format!("<think>\n{}\n</think>\n\n{}", r.trim_matches('\n'), content)
            }
            _ => content,
        };
        out.push(Message { role, content });
    }
    Ok(out)
}

/// A message's non-blank `reasoning_content` (or `reasoning`); templates read it on
/// assistant messages only. Null or blank is none (Qwen3 renders no reasoning for it).
fn reasoning_of(obj: &serde_json::Map<String, Value>) -> Result<Option<&str>, String> {
    for key in ["reasoning_content", "reasoning"] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.trim().is_empty() => {}
            Some(Value::String(s)) => return Ok(Some(s)),
            Some(v) => return Err(format!("{key:?} is a {}, expected a string", kind(v))),
        }
    }
    Ok(None)
}

/// A string, or OpenAI content parts `[{"type": "text", "text": ...}]` joined (any other part
/// type is not text a tokenizer can take).
fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let mut s = String::new();
            for p in parts {
                if p.get("type").and_then(Value::as_str) != Some("text") {
                    return None;
                }
                s.push_str(p.get("text")?.as_str()?);
            }
            Some(s)
        }
        _ => None,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_and_sharegpt_give_the_same_conversation() {
        let a = parse_sample(&json!({"messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}))
        .unwrap();
        let b = parse_sample(&json!({"system": "be brief", "conversations": [
            {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}))
        .unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].role, Role::System);
        assert_eq!(b[0].content, "be brief");
        assert_eq!(&b[1..], &a[..]);
        assert_eq!(a[1].role, Role::Assistant);
        let own = parse_sample(&json!({"system": "top", "messages": [
            {"role": "system", "content": "own"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}]}))
        .unwrap();
        assert_eq!(own.len(), 3);
        assert_eq!(own[0].content, "own");
    }

    #[test]
    fn content_parts_are_joined_and_other_parts_rejected() {
        let m = parse_sample(&json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"}]}))
        .unwrap();
        assert_eq!(m[0].content, "ab");
        let e = parse_sample(&json!({"messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": "x"}]},
            {"role": "assistant", "content": "c"}]}))
        .unwrap_err();
        assert!(matches!(e, SkipReason::Malformed { message: 0, .. }), "{e}");
    }

    #[test]
    fn assistant_reasoning_content_is_folded_into_a_think_block() {
        let m = parse_sample(&json!({"messages": [
            {"role": "user", "content": "q", "reasoning_content": "not read"},
            {"role": "assistant", "content": "Yes.", "reasoning_content": "\nbecause\n"},
            {"role": "assistant", "content": "Sure.", "reasoning": "also"},
            {"role": "assistant", "content": "No.", "reasoning_content": null},
            {"role": "assistant", "content": "Ok.", "reasoning_content": " "}]}))
        .unwrap();
        assert_eq!(m[0].content, "q");
        assert_eq!(m[1].content, "<think>\nbecause\n</think>\n\nYes.");
        assert_eq!(m[2].content, "<think>\nalso\n</think>\n\nSure.");
        assert_eq!(
            (m[3].content.as_str(), m[4].content.as_str()),
            ("No.", "Ok.")
        );
        for (msg, needle) in [
            (
                json!({"role": "assistant", "content": "a", "reasoning_content": 1}),
                "number",
            ),
            (
                json!({"role": "assistant", "content": "<think>x</think>a", "reasoning_content": "y"}),
                "both",
            ),
        ] {
            match parse_sample(&json!({"messages": [{"role": "user", "content": "q"}, msg]})) {
                Err(SkipReason::Malformed { message: 1, detail }) => {
                    assert!(detail.contains(needle), "{detail}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn malformed_samples_name_the_message() {
        let cases = [
            (
                json!({"messages": [{"role": "wizard", "content": "x"}]}),
                0,
                "unknown role",
            ),
            (
                json!({"messages": [{"role": "user", "content": 3}]}),
                0,
                "number",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}, "oops"]}),
                1,
                "string",
            ),
            (json!({"messages": [{"role": "user"}]}), 0, "no \"content\""),
            (
                json!({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]}),
                1,
                "after the first",
            ),
        ];
        for (sample, at, needle) in cases {
            match parse_sample(&sample) {
                Err(SkipReason::Malformed { message, detail }) => {
                    assert_eq!(message, at, "{detail}");
                    assert!(detail.contains(needle), "{detail:?} lacks {needle:?}");
                }
                other => panic!("{sample}: {other:?}"),
            }
        }
        assert_eq!(
            parse_sample(&json!({"text": "x"})),
            Err(SkipReason::NoConversation)
        );
        assert_eq!(
            parse_sample(&json!({"messages": []})),
            Err(SkipReason::NoConversation)
        );
        assert_eq!(
            parse_sample(&json!({"messages": [{"role": "user", "content": "x"}]})),
            Err(SkipReason::NoAssistant)
        );
    }
}

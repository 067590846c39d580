//! From a conversation to the prompt the target answers: every turn but a final assistant
//! turn, rendered with the generation prompt and tokenized as transformers'
//! `apply_chat_template(..., add_generation_prompt=True, tokenize=True)` does.

use dflash_prepare::{Message, Preparer, Role};

/// The turns the target answers: the conversation without its final assistant turn. `Err`
/// says why there is nothing to answer.
pub fn prompt_turns(mut messages: Vec<Message>) -> Result<Vec<Message>, String> {
    if messages.last().is_some_and(|m| m.role == Role::Assistant) {
        messages.pop();
    }
    if !messages.iter().any(|m| m.role == Role::User) {
        return Err("no user turn to answer".into());
    }
    match messages.last().map(|m| m.role) {
        Some(Role::User | Role::Tool) => Ok(messages),
        Some(r) => Err(format!(
            "the prompt ends with a {} turn after the last assistant turn is removed: no user \
             or tool turn to answer",
            r.as_str()
        )),
        None => Err("empty conversation".into()),
    }
}

/// The prompt's token ids.
pub fn prompt_ids(preparer: &Preparer, turns: &[Message]) -> Result<Vec<u32>, String> {
    let rendered = preparer
        .template()
        .render(turns, true)
        .map_err(|e| format!("chat template failed: {e}"))?;
    let enc = preparer
        .tokenizer()
        .encode(rendered.text.as_str(), false)
        .map_err(|e| format!("tokenizer failed: {e}"))?;
    Ok(enc.get_ids().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(role: Role, content: &str) -> Message {
        Message {
            role,
            content: content.into(),
        }
    }

    #[test]
    fn the_final_assistant_turn_is_dropped_and_earlier_ones_kept() {
        let conv = vec![
            m(Role::System, "s"),
            m(Role::User, "a"),
            m(Role::Assistant, "b"),
            m(Role::User, "c"),
            m(Role::Assistant, "d"),
        ];
        let p = prompt_turns(conv.clone()).unwrap();
        assert_eq!(p, conv[..4].to_vec());
        assert_eq!(
            prompt_turns(conv[..4].to_vec()).unwrap(),
            conv[..4].to_vec()
        );
    }

    #[test]
    fn conversations_with_nothing_to_answer_are_refused() {
        let e = prompt_turns(vec![m(Role::System, "s"), m(Role::Assistant, "x")]).unwrap_err();
        assert!(e.contains("no user turn"), "{e}");
        let two = vec![
            m(Role::User, "a"),
            m(Role::Assistant, "b"),
            m(Role::Assistant, "c"),
        ];
        let e = prompt_turns(two).unwrap_err();
        assert!(e.contains("ends with a assistant turn"), "{e}");
    }
}

//! From a conversation to the prompts the target answers: every assistant turn is written
//! again by the target, in order, each conditioned on the turns before it (the earlier
//! assistant turns being the target's own answers by then), since `dflash prepare`
//! supervises every assistant turn. A conversation ending with a user or tool turn gets a
//! new assistant turn as well. A prompt is rendered with the generation prompt and tokenized
//! as transformers' `apply_chat_template(..., add_generation_prompt=True, tokenize=True)`
//! does.

use dflash_prepare::{Message, Preparer, Role};

/// The indices of `messages` the target writes: every assistant turn, and a new (empty)
/// assistant turn appended after a final user or tool turn. `Err` says why a turn has
/// nothing to answer: each must follow a user or tool turn, with a user turn before it.
pub fn answer_turns(messages: &mut Vec<Message>) -> Result<Vec<usize>, String> {
    if messages.is_empty() {
        return Err("empty conversation".into());
    }
    if matches!(
        messages.last().map(|m| m.role),
        Some(Role::User | Role::Tool)
    ) {
        messages.push(Message {
            role: Role::Assistant,
            content: String::new(),
        });
    }
    let answers: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i].role == Role::Assistant)
        .collect();
    if answers.is_empty() {
        return Err(format!(
            "no turn to answer: the conversation ends with a {} turn",
            messages[messages.len() - 1].role.as_str()
        ));
    }
    for (k, &i) in answers.iter().enumerate() {
        let turn = || match answers.len() {
            1 => "the assistant turn".to_string(),
            n => format!("assistant turn {} of {n}", k + 1),
        };
        if !messages[..i].iter().any(|m| m.role == Role::User) {
            return Err(format!("no user turn to answer before {}", turn()));
        }
        let before = messages[i - 1].role;
        if !matches!(before, Role::User | Role::Tool) {
            return Err(format!(
                "{} follows a {} turn: no user or tool turn to answer",
                turn(),
                before.as_str()
            ));
        }
    }
    Ok(answers)
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
    fn every_assistant_turn_is_answered_and_a_final_user_turn_gets_one() {
        let conv = vec![
            m(Role::System, "s"),
            m(Role::User, "a"),
            m(Role::Assistant, "b"),
            m(Role::User, "c"),
            m(Role::Tool, "t"),
            m(Role::Assistant, "d"),
        ];
        let mut c = conv.clone();
        assert_eq!(answer_turns(&mut c).unwrap(), [2, 5]);
        assert_eq!(c, conv, "nothing appended after a final assistant turn");
        let mut c = conv[..4].to_vec();
        assert_eq!(answer_turns(&mut c).unwrap(), [2, 4]);
        assert_eq!(c[4], m(Role::Assistant, ""));
    }

    #[test]
    fn conversations_with_nothing_to_answer_are_refused() {
        let e = answer_turns(&mut vec![m(Role::System, "s"), m(Role::Assistant, "x")]).unwrap_err();
        assert!(e.contains("no user turn"), "{e}");
        let mut two = vec![
            m(Role::User, "a"),
            m(Role::Assistant, "b"),
            m(Role::Assistant, "c"),
        ];
        let e = answer_turns(&mut two).unwrap_err();
        assert!(
            e.contains("assistant turn 2 of 2 follows a assistant turn"),
            "{e}"
        );
        let e = answer_turns(&mut vec![m(Role::System, "s")]).unwrap_err();
        assert!(e.contains("ends with a system turn"), "{e}");
        assert!(answer_turns(&mut vec![]).is_err());
    }
}

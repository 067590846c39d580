//! One sample on its way through the generation: its conversation, the assistant turns the
//! target writes ([`crate::prompt::answer_turns`]) and those written so far. Turn `k` of a
//! sample is generated as sequence [`sequence_id`]`(index, k)`, so every turn draws from a
//! sampling stream of its own and turn 0's stream is the sample index's, as before turns.

use dflash_models::generate::{Finish, Generated, Prompt};
use dflash_prepare::{Message, Preparer};
use serde_json::{Value, json};

use crate::prompt::{answer_turns, prompt_ids};

/// Bits of a sequence id holding the sample index; the turn is above them.
const INDEX_BITS: u32 = 40;

/// The generation's id of turn `turn` of sample `index`.
pub(crate) fn sequence_id(index: u64, turn: usize) -> Result<u64, String> {
    if index >> INDEX_BITS != 0 || (turn as u64) >> (64 - INDEX_BITS) != 0 {
        return Err(format!(
            "sample {index}, turn {turn}: past the 2^{INDEX_BITS} samples or 2^{} turns a \
             sequence id holds",
            64 - INDEX_BITS
        ));
    }
    Ok(index | (turn as u64) << INDEX_BITS)
}

/// The sample index of a sequence id.
pub(crate) fn sample_of(id: u64) -> u64 {
    id & ((1 << INDEX_BITS) - 1)
}

/// `"sample i, turn k"` (`k` counted from 1, as reasons count turns) for a sequence id.
pub(crate) fn describe_id(id: u64) -> String {
    format!("sample {}, turn {}", sample_of(id), (id >> INDEX_BITS) + 1)
}

/// How one turn ended.
struct TurnEnd {
    finish: Finish,
    prompt_tokens: usize,
    new_tokens: usize,
}

pub(crate) struct Conversation {
    index: u64,
    /// The conversation; the turns at `answers[..ends.len()]` hold the target's answers.
    messages: Vec<Message>,
    answers: Vec<usize>,
    ends: Vec<TurnEnd>,
}

impl Conversation {
    pub(crate) fn new(index: u64, mut messages: Vec<Message>) -> Result<Self, String> {
        let answers = answer_turns(&mut messages)?;
        Ok(Conversation {
            index,
            messages,
            answers,
            ends: Vec::new(),
        })
    }

    pub(crate) fn index(&self) -> u64 {
        self.index
    }

    /// The turns answered so far.
    pub(crate) fn answered(&self) -> usize {
        self.ends.len()
    }

    /// Whether every turn has its answer.
    pub(crate) fn is_complete(&self) -> bool {
        self.ends.len() == self.answers.len()
    }

    /// `"turn k of n: "` for a conversation of several turns, naming the next turn (or the
    /// last one when complete) in a reason; empty for one turn.
    pub(crate) fn turn_label(&self) -> String {
        match self.answers.len() {
            1 => String::new(),
            n => format!("turn {} of {n}: ", self.ends.len().min(n - 1) + 1),
        }
    }

    /// The next turn's prompt, or why it has none.
    pub(crate) fn next_prompt(
        &self,
        preparer: &Preparer,
        capacity: usize,
    ) -> Result<Prompt, NoPrompt> {
        let turn = self.ends.len();
        let ids = prompt_ids(preparer, &self.messages[..self.answers[turn]])
            .map_err(|r| NoPrompt::Failed(format!("{}{r}", self.turn_label())))?;
        // The generation refuses an empty prompt, and with it the whole run: a template
        // that renders nothing (say, one that prints bare contents, with an empty one)
        // drops this sample alone.
        if ids.is_empty() {
            return Err(NoPrompt::Failed(format!(
                "{}the chat template renders an empty prompt: nothing for the target to answer",
                self.turn_label()
            )));
        }
        if ids.len() >= capacity {
            return Err(NoPrompt::TooLong(format!(
                "{}the prompt has {} tokens: no room for an answer within the capacity of \
                 {capacity} (--capacity)",
                self.turn_label(),
                ids.len()
            )));
        }
        Ok(Prompt {
            id: sequence_id(self.index, turn).map_err(NoPrompt::Failed)?,
            ids,
        })
    }

    /// Records the next turn's answer: its text and how `g` ended.
    pub(crate) fn answer(&mut self, text: String, g: &Generated) {
        let at = self.answers[self.ends.len()];
        self.messages[at].content = text;
        self.ends.push(TurnEnd {
            finish: g.finish,
            prompt_tokens: g.prompt_len,
            new_tokens: g.tokens.len(),
        });
    }

    /// The output line of the conversation: its messages (of an incomplete one, those up to
    /// and including its last answer, the target's throughout, which `prepare` trains on),
    /// `finish_reason` (`eos` where every turn ended at EOS, else the first turn's other
    /// reason), the last turn's `prompt_tokens`, the new tokens of all turns, and the number
    /// of turns written.
    pub(crate) fn output_line(&self) -> Value {
        let end = match (self.is_complete(), self.ends.len().checked_sub(1)) {
            (false, Some(last)) => self.answers[last] + 1,
            _ => self.messages.len(),
        };
        let messages: Vec<Value> = self.messages[..end]
            .iter()
            .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
            .collect();
        let finish = self
            .ends
            .iter()
            .map(|e| e.finish)
            .find(|&f| f != Finish::Eos)
            .unwrap_or(Finish::Eos);
        json!({
            "index": self.index,
            "messages": messages,
            "finish_reason": finish.as_str(),
            "prompt_tokens": self.ends.last().map_or(0, |e| e.prompt_tokens),
            "new_tokens": self.ends.iter().map(|e| e.new_tokens).sum::<usize>(),
            "turns": self.ends.len(),
        })
    }
}

/// Why a turn has no prompt.
#[derive(Debug)]
pub(crate) enum NoPrompt {
    /// The conversation so far leaves no room for an answer within the capacity.
    TooLong(String),
    /// The template, the tokenizer or the sequence id failed, or the prompt is empty.
    Failed(String),
}

impl NoPrompt {
    pub(crate) fn reason(self) -> String {
        match self {
            NoPrompt::TooLong(r) | NoPrompt::Failed(r) => r,
        }
    }
}

/// The text of a generated answer (its EOS left out), or why the sample is skipped: ids
/// past the tokenizer's vocabulary (a model with a padded embedding can emit them; the
/// tokenizer would drop them silently) or that do not decode would be training text that
/// the target never wrote.
pub(crate) fn answer_text(preparer: &Preparer, g: &Generated) -> Result<String, String> {
    let answer = match g.finish {
        Finish::Eos => &g.tokens[..g.tokens.len() - 1],
        _ => &g.tokens[..],
    };
    let tok = preparer.tokenizer();
    let vocab = tok.get_vocab_size(true);
    if let Some(&id) = answer.iter().find(|&&id| id as usize >= vocab) {
        return Err(format!(
            "the target's answer holds id {id}, past the tokenizer's {vocab} tokens"
        ));
    }
    tok.decode(answer, true)
        .map_err(|e| format!("the target's answer does not decode ({e}): ids {answer:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_ids_keep_turn_zero_at_the_index_and_round_trip() {
        assert_eq!(sequence_id(7, 0).unwrap(), 7);
        let id = sequence_id(7, 3).unwrap();
        assert_ne!(id, 7);
        assert_eq!(sample_of(id), 7);
        assert!(sequence_id(1 << 40, 0).is_err());
        assert!(sequence_id(0, 1 << 24).is_err());
    }
}

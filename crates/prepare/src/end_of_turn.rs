//! The end of an assistant turn: the token a target stops generating at (`<|im_end|>`,
//! `<|eot_id|>`), which `dflash prepare` supervises after each turn's content. Serving engines
//! verify the drafted end of an answer like any other token, so a drafter never trained on it
//! loses the last token of every answer; SpecForge's masks cover it too.
//!
//! The tokens are the ids `dflash_models::eos` reads (generation stops there; `regenerate`
//! stops its answers there), as text through the tokenizer. What a turn ends with is then
//! found in the template itself: the turn rendered with a sentinel for its
//! content, the text after the sentinel up to and including the first of those tokens (a
//! template may render text between the content and the token, e.g. a newline, which the
//! target generates too). A template that renders none of them after the content (or a target
//! that names none) leaves the turn's end unsupervised.

use std::path::Path;

use tokenizers::Tokenizer;

use crate::conversation::Message;
use crate::error::PrepareError;
use crate::template::ChatTemplate;

/// The text of the target's end-of-answer tokens ([`dflash_models::eos::eos_ids_of_dir`]),
/// each once. Absent files are skipped; a malformed file, or an id the tokenizer does not
/// hold, is an error naming the file.
pub fn end_of_turn_tokens(dir: &Path, tokenizer: &Tokenizer) -> Result<Vec<String>, PrepareError> {
    let ids = dflash_models::eos::eos_ids_of_dir(dir)?;
    let mut out: Vec<String> = Vec::with_capacity(ids.len());
    for id in ids {
        if tokenizer.id_to_token(id).is_none() {
            return Err(PrepareError::target(
                dir,
                format!(
                    "eos_token_id {id} is not a token of tokenizer.json (read from \
                     generation_config.json, else config.json)"
                ),
            ));
        }
        // Decoded, not the vocabulary's spelling: a byte-level vocabulary spells `\n` `Ċ`.
        if let Ok(text) = tokenizer.decode(&[id], false)
            && !text.is_empty()
            && !out.contains(&text)
        {
            out.push(text);
        }
    }
    Ok(out)
}

/// What the template renders after turn `k`'s content up to and including the first of
/// `tokens` (None where it renders none of them, or rendering fails): the rendering of
/// `messages[..=k]` with `sentinel` for that content, from the sentinel on.
pub(crate) fn turn_end(
    template: &ChatTemplate,
    tokens: &[String],
    messages: &[Message],
    k: usize,
    sentinel: &str,
) -> Option<String> {
    if tokens.is_empty() {
        return None;
    }
    let mut probe = messages[..=k].to_vec();
    probe[k].content = sentinel.to_string();
    let text = template.render(&probe, false).ok()?.text;
    let after = &text[text.rfind(sentinel)? + sentinel.len()..];
    let end = tokens
        .iter()
        .filter_map(|t| after.find(t.as_str()).map(|at| at + t.len()))
        .min()?;
    Some(after[..end].to_string())
}

/// How many bytes of `rest` (the rendering after a turn's supervised content) are the turn's
/// end `end` (see [`turn_end`]): all of it where `rest` starts with it; where the content's
/// trailing whitespace was matched apart from the template's (one trims, the other not), the
/// whitespace of `rest` and then `end` without its leading whitespace; else 0.
pub(crate) fn turn_end_len(rest: &str, end: &str) -> usize {
    if rest.starts_with(end) {
        return end.len();
    }
    let skipped = rest.len() - rest.trim_start().len();
    let bare = end.trim_start();
    if !bare.is_empty() && rest[skipped..].starts_with(bare) {
        skipped + bare.len()
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_turn_end_is_matched_with_or_without_the_whitespace_before_it() {
        assert_eq!(turn_end_len("<|im_end|>\n<|im_start|>", "<|im_end|>"), 10);
        assert_eq!(turn_end_len("\n<|im_end|>\n", "\n<|im_end|>"), 11);
        // The content's own trailing newline was matched as part of the content.
        assert_eq!(turn_end_len("<|im_end|>", "\n<|im_end|>"), 10);
        // Whitespace the content kept but the template's end does not start with.
        assert_eq!(turn_end_len("  <|eot_id|>", "<|eot_id|>"), 12);
        assert_eq!(turn_end_len("<|im_start|>user", "<|im_end|>"), 0);
        assert_eq!(turn_end_len("", "<|im_end|>"), 0);
    }
}

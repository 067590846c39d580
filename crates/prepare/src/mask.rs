//! From a conversation to `input_ids` + `loss_mask`.
//!
//! The supervised character spans of the rendered conversation are, with a template that has
//! `{% generation %}` blocks, what those blocks rendered (transformers'
//! `return_assistant_tokens_mask`); otherwise each assistant message's content (trimmed; with
//! a `<think>` block in the content, from the reasoning to the end of the answer), found in
//! order in the rendering, followed by the end of the turn: what the template renders after the
//! content through the target's end-of-answer token ([`crate::end_of_turn`]). So an empty
//! `<think>\n\n</think>\n\n` that a template inserts (Qwen3) is never supervised, nor are
//! role headers; the `<|im_end|>` that ends an answer is.
//!
//! A turn's content is looked for past its role header: a match must reach beyond the
//! turn's *anchor*, text the template renders before the content whatever it is, so a short
//! reply such as `a` is never matched inside `<|im_start|>assistant`, nor `hi` inside the
//! `<think>` Qwen3 inserts before the last turn's content. The anchor is the longer of two
//! common prefixes with the whole rendering: that of the rendering of the messages before the
//! turn with the generation prompt (the earlier messages and the turn's header), and that of
//! the whole conversation rendered with the turn's content replaced by a sentinel, up to the
//! sentinel (also what a template inserts after the generation prompt; where the turn renders
//! differently with its real content, as Qwen3's reasoning does, the prefix stops where they
//! differ, still before the content).
//!
//! Each turn's span is cross-checked against the template itself: rendering the conversation
//! up to the turn with the generation prompt, then with the turn, must extend the first
//! rendering by text that contains the span's text; the span must reach past the anchor; and
//! where the whole conversation's rendering starts with the rendering up to the turn, the span
//! must lie inside the extension.
//!
//! A token is supervised when its byte offsets overlap a span, which for tokens that tile the
//! text is transformers' `char_to_token(start) ..= char_to_token(end - 1)`.
//!
//! A template may drop the reasoning of earlier assistant turns (Qwen3 renders it for the
//! turns after the last user message only), so one rendering of a multi-turn conversation
//! would train on none of it; [`Preparer::prepare_conversation`] adds a sample ending with
//! each such turn, where it renders.

use std::ops::Range;
use std::path::Path;

use tokenizers::Tokenizer;

use crate::conversation::{Message, Role};
use crate::end_of_turn::{end_of_turn_tokens, turn_end, turn_end_len};
use crate::error::{PrepareError, SkipReason};
use crate::template::{CLOSE, ChatTemplate, OPEN};

/// One prepared sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub ids: Vec<u32>,
    pub loss_mask: Vec<u8>,
}

/// The samples of one conversation (see [`Preparer::prepare_conversation`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedConversation {
    /// The whole conversation first, then one per turn whose reasoning it drops.
    pub samples: Vec<Prepared>,
    /// Assistant turns with reasoning that no sample supervises.
    pub reasoning_dropped: usize,
}

/// A target's chat template and tokenizer.
pub struct Preparer {
    template: ChatTemplate,
    tokenizer: Tokenizer,
    /// The target's end-of-answer tokens as text (see [`crate::end_of_turn`]).
    end_of_turn: Vec<String>,
}

impl Preparer {
    /// `DIR/tokenizer.json` and the chat template of `DIR` (see
    /// [`ChatTemplate::from_target_dir`]), or the one in `template` where given.
    pub fn from_target_dir(dir: &Path, template: Option<&Path>) -> Result<Self, PrepareError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(PrepareError::target(
                &path,
                "no tokenizer.json: the target directory must hold the HF tokenizer files",
            ));
        }
        let tokenizer = Tokenizer::from_file(&path)
            .map_err(|e| PrepareError::target(&path, format!("not a usable tokenizer: {e}")))?;
        let template = match template {
            Some(t) => ChatTemplate::from_target_dir_with(dir, t)?,
            None => ChatTemplate::from_target_dir(dir)?,
        };
        let end_of_turn = end_of_turn_tokens(dir, &tokenizer)?;
        Ok(Self::new(template, tokenizer).with_end_of_turn(end_of_turn))
    }

    pub fn new(template: ChatTemplate, mut tokenizer: Tokenizer) -> Self {
        // transformers tokenizes the rendered chat with truncation and padding off, whatever
        // the file configures.
        tokenizer.with_truncation(None).ok();
        tokenizer.with_padding(None);
        Preparer {
            template,
            tokenizer,
            end_of_turn: Vec::new(),
        }
    }

    /// Supervises each assistant turn through the first of `tokens` (the target's
    /// end-of-answer tokens as text) the template renders after its content; none (the
    /// default of [`new`](Self::new)) supervises the content alone. Templates with
    /// `{% generation %}` blocks supervise what their blocks hold, whatever these are.
    pub fn with_end_of_turn(mut self, tokens: Vec<String>) -> Self {
        self.end_of_turn = tokens;
        self
    }

    /// The end-of-answer tokens turns are supervised through (see
    /// [`with_end_of_turn`](Self::with_end_of_turn)).
    pub fn end_of_turn(&self) -> &[String] {
        &self.end_of_turn
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The tokenizer, truncation and padding off (as transformers runs it on a chat).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Token ids and the loss mask of one conversation.
    pub fn prepare(&self, messages: &[Message]) -> Result<Prepared, SkipReason> {
        let (text, spans) = self.supervised_spans(messages)?;
        self.encode(&text, &spans)
    }

    /// The samples of one conversation: the whole of it ([`prepare`](Self::prepare)), then,
    /// for each assistant turn whose reasoning that rendering drops (Qwen3 drops it from every
    /// turn before the last user message), the conversation up to and including that turn,
    /// where it is the last turn and its reasoning renders.
    ///
    /// Only that turn is supervised in its extra sample: it is what the target generated with
    /// the earlier turns in front of it (rendered there as they are in the whole sample,
    /// without their reasoning), and the earlier turns are already supervised in the whole
    /// sample and in their own extra samples, so supervising them again would count them
    /// twice. A turn whose reasoning no sample supervises (the template drops it even from the
    /// last turn, or its extra sample fails) is counted in `reasoning_dropped`.
    pub fn prepare_conversation(
        &self,
        messages: &[Message],
    ) -> Result<PreparedConversation, SkipReason> {
        let (text, turns) = self.turn_spans(messages)?;
        let spans: Vec<Range<usize>> = turns.iter().filter_map(|(_, s)| s.clone()).collect();
        let mut out = PreparedConversation {
            samples: vec![self.encode(&text, &spans)?],
            reasoning_dropped: 0,
        };
        for (k, span) in &turns {
            let Some(reasoning) = reasoning_of(&messages[*k].content) else {
                continue;
            };
            if span
                .as_ref()
                .is_some_and(|s| text[s.clone()].contains(reasoning))
            {
                continue;
            }
            let extra = self
                .turn_spans(&messages[..=*k])
                .ok()
                .and_then(|(text, turns)| {
                    let last = turns.last()?.1.clone()?;
                    text[last.clone()]
                        .contains(reasoning)
                        .then(|| self.encode(&text, &[last]).ok())?
                });
            match extra {
                Some(p) => out.samples.push(p),
                None => out.reasoning_dropped += 1,
            }
        }
        Ok(out)
    }

    /// Tokenizes `text`, a token supervised where it overlaps one of `spans`.
    fn encode(&self, text: &str, spans: &[Range<usize>]) -> Result<Prepared, SkipReason> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| SkipReason::Tokenize {
                detail: e.to_string(),
            })?;
        let ids = enc.get_ids().to_vec();
        let loss_mask: Vec<u8> = enc
            .get_offsets()
            .iter()
            .map(|&(s, e)| u8::from(s < e && spans.iter().any(|r| s < r.end && e > r.start)))
            .collect();
        if loss_mask.iter().all(|&m| m == 0) {
            return Err(SkipReason::NothingSupervised);
        }
        if loss_mask.iter().all(|&m| m == 1) {
            return Err(SkipReason::AllSupervised);
        }
        Ok(Prepared { ids, loss_mask })
    }

    /// The rendered conversation and its supervised byte spans (checked, in order).
    pub fn supervised_spans(
        &self,
        messages: &[Message],
    ) -> Result<(String, Vec<Range<usize>>), SkipReason> {
        let (text, turns) = self.turn_spans(messages)?;
        Ok((text, turns.into_iter().filter_map(|(_, s)| s).collect()))
    }

    /// The rendered conversation and, per assistant message (by index), its supervised byte
    /// span (checked; None where nothing of it is supervised).
    fn turn_spans(&self, messages: &[Message]) -> Result<(String, Vec<TurnSpan>), SkipReason> {
        if let Some(k) = messages
            .iter()
            .position(|m| m.content.contains([OPEN, CLOSE]))
        {
            return Err(SkipReason::MarkerInContent { message: k });
        }
        let turns: Vec<usize> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::Assistant)
            .map(|(k, _)| k)
            .collect();
        let Some(&first_turn) = turns.first() else {
            return Err(SkipReason::NoAssistant);
        };
        let full = self
            .template
            .render(messages, false)
            .map_err(|detail| SkipReason::Render { detail })?;
        // What the template renders before each turn's content, header included.
        let before: Vec<String> = turns
            .iter()
            .map(|&k| {
                self.template
                    .render(&messages[..k], true)
                    .map(|r| r.text)
                    .map_err(|e| SkipReason::CrossCheck {
                        message: k,
                        detail: format!("rendering the turns before it failed: {e}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        let anchors: Vec<usize> = turns
            .iter()
            .zip(&before)
            .map(|(&k, b)| {
                common_prefix(&full.text, b).max(self.content_anchor(messages, k, &full.text))
            })
            .collect();
        let per_turn: Vec<Option<Range<usize>>> = if self.template.has_generation_blocks() {
            if full.generation.len() != turns.len() {
                return Err(SkipReason::CrossCheck {
                    message: first_turn,
                    detail: format!(
                        "the template's generation blocks rendered {} spans for {} assistant \
                         messages",
                        full.generation.len(),
                        turns.len()
                    ),
                });
            }
            full.generation.iter().cloned().map(Some).collect()
        } else {
            let mut spans = find_content_spans(messages, &full.text, &anchors)?;
            for (span, &k) in spans.iter_mut().zip(&turns) {
                if let Some(span) = span
                    && let Some(end) =
                        turn_end(&self.template, &self.end_of_turn, messages, k, SENTINEL)
                {
                    span.end += turn_end_len(&full.text[span.end..], &end);
                }
            }
            spans
        };
        for (t, &k) in turns.iter().enumerate() {
            if let Some(span) = &per_turn[t]
                && !span.is_empty()
            {
                self.cross_check(messages, k, &full.text, span, &before[t], anchors[t])?;
            }
        }
        let spans = turns
            .into_iter()
            .zip(per_turn)
            .map(|(k, s)| (k, s.filter(|s| !s.is_empty())))
            .collect();
        Ok((full.text, spans))
    }

    /// The length of the text `full` shares with the rendering of `messages` whose message
    /// `k` holds [`SENTINEL`] instead of its content, up to where the sentinel is rendered:
    /// text rendered before the content whatever it is. 0 where the sentinel is not rendered
    /// as written (a template that transforms the content) or rendering fails.
    fn content_anchor(&self, messages: &[Message], k: usize, full: &str) -> usize {
        let mut probe = messages.to_vec();
        probe[k].content = SENTINEL.to_string();
        let Ok(r) = self.template.render(&probe, false) else {
            return 0;
        };
        r.text
            .find(SENTINEL)
            .map_or(0, |p| common_prefix(full, &r.text[..p]))
    }

    /// `without` is the rendering of `messages[..k]` with the generation prompt, `anchor` the
    /// length of its common prefix with `full`.
    fn cross_check(
        &self,
        messages: &[Message],
        k: usize,
        full: &str,
        span: &Range<usize>,
        without: &str,
        anchor: usize,
    ) -> Result<(), SkipReason> {
        let fail = |detail: String| SkipReason::CrossCheck { message: k, detail };
        let with = self
            .template
            .render(&messages[..=k], false)
            .map_err(|e| fail(format!("rendering up to it failed: {e}")))?
            .text;
        let Some(turn) = with.strip_prefix(without) else {
            return Err(fail(
                "rendering up to the turn does not extend rendering without it (with the \
                 generation prompt)"
                    .into(),
            ));
        };
        let supervised = &full[span.clone()];
        if !turn.contains(supervised) {
            return Err(fail(format!(
                "the supervised text {:?} is not in what the template renders for the turn ({:?})",
                clip(supervised),
                clip(turn)
            )));
        }
        if span.end <= anchor {
            return Err(fail(format!(
                "the supervised bytes {}..{} lie in what the template renders before the turn's \
                 content (bytes ..{anchor})",
                span.start, span.end
            )));
        }
        if full.starts_with(with.as_str()) && (span.start < without.len() || span.end > with.len())
        {
            return Err(fail(format!(
                "the supervised bytes {}..{} lie outside the turn's bytes {}..{}",
                span.start,
                span.end,
                without.len(),
                with.len()
            )));
        }
        Ok(())
    }
}

/// An assistant message's index and its supervised byte span, if any.
type TurnSpan = (usize, Option<Range<usize>>);

/// Stands for a turn's content in [`Preparer::content_anchor`]: private-use characters that
/// neither real text nor template markup holds (and not the generation markers).
const SENTINEL: &str = "\u{E000}dflash-prepare content\u{E001}";

/// The length of the longest common prefix of `a` and `b`, on a character boundary of both.
fn common_prefix(a: &str, b: &str) -> usize {
    let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    // Equal bytes up to `n`, so a boundary of `a` below `n` is one of `b` too.
    (0..=n).rev().find(|&i| a.is_char_boundary(i)).unwrap_or(0)
}

/// The first character boundary of `s` at or after `i` (`s.len()` past the end).
fn ceil_boundary(s: &str, i: usize) -> usize {
    (i..s.len())
        .find(|&j| s.is_char_boundary(j))
        .unwrap_or(s.len())
}

fn clip(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head}...")
    }
}

/// Each assistant message's span in `text` (None for an empty content), searching in message
/// order: every message's content moves the cursor past itself where it is found, so an
/// answer that repeats an earlier message is not matched there. `anchors` holds, per assistant
/// message, the length of the text the template renders before its content whatever that
/// content is (see the module docs): a match must end past it, so none lies in a role header.
///
/// The content is looked for as written, then trimmed (templates that trim it). A content
/// with a non-empty `<think>` block that is not rendered as written (Qwen3 re-renders it, or
/// drops it from earlier turns) spans from its reasoning, where that is rendered, to its
/// answer past the following `</think>`; else it is its answer alone. An empty
/// `<think></think>` in the content is dropped, so it is never supervised.
fn find_content_spans(
    messages: &[Message],
    text: &str,
    anchors: &[usize],
) -> Result<Vec<Option<Range<usize>>>, SkipReason> {
    let mut cursor = 0usize;
    let mut out = Vec::new();
    // The first candidate found in `from..to` that ends past `anchor`: (start, end).
    let find = |from: usize, to: usize, anchor: usize, cands: &[&str]| {
        cands.iter().filter(|c| !c.is_empty()).find_map(|c| {
            // A match starting before `anchor + 1 - len` would end at or before the anchor.
            let from = from.max(ceil_boundary(text, (anchor + 1).saturating_sub(c.len())));
            if from > to {
                return None;
            }
            text[from..to]
                .find(c)
                .map(|at| (from + at, from + at + c.len()))
        })
    };
    let mut anchors = anchors.iter().copied().peekable();
    for (k, m) in messages.iter().enumerate() {
        let content = m.content.as_str();
        if m.role != Role::Assistant {
            if let Some((_, end)) = find(cursor, text.len(), 0, &[content, content.trim()]) {
                cursor = end;
            }
            continue;
        }
        let anchor = anchors.next().unwrap_or(0);
        // This turn's text ends before the next assistant turn's anchor.
        let turn_end = anchors
            .peek()
            .copied()
            .unwrap_or(text.len())
            .min(text.len());
        if content.trim().is_empty() {
            out.push(None);
            continue;
        }
        let found = match split_think(content) {
            None => find(cursor, text.len(), anchor, &[content, content.trim()]),
            Some((reasoning, answer)) if reasoning.trim().is_empty() => {
                let a = answer.trim_start_matches('\n');
                find(cursor, text.len(), anchor, &[a, a.trim()])
            }
            Some((reasoning, answer)) => {
                find(cursor, text.len(), anchor, &[content, content.trim()]).or_else(|| {
                    let a = answer.trim_start_matches('\n');
                    let a = [a, a.trim()];
                    let r = reasoning.trim_matches('\n');
                    let r = [r, r.trim()];
                    let (a_start, a_end) = find(cursor, text.len(), anchor, &a)?;
                    // Rendered at or before the answer's first match, the reasoning is this
                    // turn's, and the answer is what follows the `</think>` after it: that
                    // first match may lie in the reasoning or in the tag (`k`).
                    if let Some((r_start, r_end)) =
                        find(cursor, text.len(), anchor, &r).filter(|&(s, _)| s <= a_start)
                    {
                        // Both inside this turn: a turn rendered without its reasoning (an
                        // earlier Qwen3 turn) has no `</think>` of its own.
                        let close = text.get(r_end..turn_end).and_then(|t| t.find("</think>"));
                        if let Some(t) = close {
                            let after = r_end + t + "</think>".len();
                            if let Some((_, end)) = find(after, turn_end, anchor, &a) {
                                return Some((r_start, end));
                            }
                        }
                    }
                    let start = find(cursor, a_start, anchor, &r).map_or(a_start, |(s, _)| s);
                    Some((start, a_end))
                })
            }
        };
        match found {
            Some((start, end)) => {
                cursor = end;
                out.push(Some(start..end));
            }
            None => return Err(SkipReason::ContentNotFound { message: k }),
        }
    }
    Ok(out)
}

/// The non-blank reasoning of a content's `<think>` block, trimmed (as templates render it).
fn reasoning_of(content: &str) -> Option<&str> {
    split_think(content)
        .map(|(r, _)| r.trim())
        .filter(|r| !r.is_empty())
}

/// `(reasoning, answer)` of a content with a `</think>`: the reasoning is what precedes it
/// (after the last `<think>`), the answer what follows, as Qwen3's template splits them.
fn split_think(content: &str) -> Option<(&str, &str)> {
    let at = content.rfind("</think>")?;
    let before = &content[..at];
    let reasoning = before.rsplit("<think>").next().unwrap_or(before);
    Some((reasoning, &content[at + "</think>".len()..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(role: Role, c: &str) -> Message {
        Message {
            role,
            content: c.into(),
        }
    }

    #[test]
    fn think_blocks_split_like_qwen3() {
        assert_eq!(split_think("hello "), None);
        assert_eq!(
            split_think("<think>\n\n</think>\n\nhi"),
            Some(("\n\n", "\n\nhi"))
        );
        assert_eq!(
            split_think("<think>\nwhy\n</think>\nhi"),
            Some(("\nwhy\n", "\nhi"))
        );
        assert_eq!(split_think("why</think>hi"), Some(("why", "hi")));
    }

    fn spans_of<'a>(msgs: &[Message], text: &'a str) -> Vec<Option<&'a str>> {
        find_content_spans(msgs, text, &[])
            .unwrap()
            .into_iter()
            .map(|s| s.map(|s| &text[s]))
            .collect()
    }

    #[test]
    fn content_search_skips_a_repeat_in_an_earlier_message() {
        let msgs = [
            m(Role::User, "yes"),
            m(Role::Assistant, "yes"),
            m(Role::User, "and?"),
            m(Role::Assistant, " no "),
        ];
        let text = "U: yes\nA: yes\nU: and?\nA: no\n";
        assert_eq!(
            find_content_spans(&msgs, text, &[]).unwrap()[0],
            Some(10..13)
        );
        // " no " is not rendered as written (the template trims): found trimmed.
        assert_eq!(spans_of(&msgs, text), [Some("yes"), Some("no")]);
        let e = find_content_spans(&msgs, "U: yes\nA: yes\nU: and?\nA: ...\n", &[]).unwrap_err();
        assert_eq!(e, SkipReason::ContentNotFound { message: 3 });
    }

    #[test]
    fn leading_indentation_is_content_when_rendered() {
        let msgs = [m(Role::User, "q"), m(Role::Assistant, "  x = 1\n")];
        assert_eq!(spans_of(&msgs, "q|  x = 1\n|"), [Some("  x = 1\n")]);
        assert_eq!(spans_of(&msgs, "q|x = 1|"), [Some("x = 1")]);
    }

    #[test]
    fn reasoning_is_supervised_where_rendered_and_an_empty_think_never() {
        let msgs = [
            m(Role::User, "q"),
            m(Role::Assistant, "<think>\nr\n</think>\n\na"),
        ];
        // Rendered as written (a template that knows nothing of thinking).
        let literal = "q|<think>\nr\n</think>\n\na|";
        assert_eq!(
            spans_of(&msgs, literal),
            [Some("<think>\nr\n</think>\n\na")]
        );
        // Re-rendered around the reasoning: from the reasoning on.
        let rerendered = "q|<think>\nr\n</think>\n\n\na|";
        assert_eq!(spans_of(&msgs, rerendered), [Some("r\n</think>\n\n\na")]);
        // An answer that also occurs in the reasoning or in the closing tag is taken after it
        // (the anchor, where the template renders the reasoning, is past the opening tag).
        for (content, text, want) in [
            (
                "<think>say it</think>it",
                "q|<think>\nsay it\n</think>\n\nit|",
                "say it",
            ),
            ("<think>r</think>k", "q|<think>\nr\n</think>\n\nk|", "r"),
        ] {
            let msgs = [m(Role::User, "q"), m(Role::Assistant, content)];
            let from = text.find(want).unwrap();
            let spans = find_content_spans(&msgs, text, &[from]).unwrap();
            assert_eq!(spans, [Some(from..text.len() - 1)]);
        }
        // Dropped: a later "r" (here in "bar") is not taken for the reasoning.
        assert_eq!(spans_of(&msgs, "q|a|bar"), [Some("a")]);
        // An empty think block in the content stays unsupervised even where the rendering
        // holds the same text.
        let empty = [
            m(Role::User, "q"),
            m(Role::Assistant, "<think>\n\n</think>\n\na"),
        ];
        assert_eq!(spans_of(&empty, "q|<think>\n\n</think>\n\na|"), [Some("a")]);
        let blank = [m(Role::User, "q"), m(Role::Assistant, " ")];
        assert_eq!(spans_of(&blank, "q||"), [None]);
    }

    #[test]
    fn a_reply_is_not_matched_in_its_role_header() {
        let msgs = [
            m(Role::User, "Pick a or b."),
            m(Role::Assistant, "a"),
            m(Role::User, "Why?"),
            m(Role::Assistant, "It is first."),
        ];
        let text = "<u>Pick a or b.</u><assistant>a</assistant><u>Why?</u><assistant>It is first.</assistant>";
        let first = text.find("a</").unwrap();
        let second = text.find("It").unwrap();
        // Without anchors the "a" of the header is taken.
        let unanchored = find_content_spans(&msgs, text, &[]).unwrap();
        assert_ne!(unanchored[0], Some(first..first + 1));
        let spans = find_content_spans(&msgs, text, &[first, second]).unwrap();
        assert_eq!(spans, [Some(first..first + 1), Some(second..second + 12)]);
        // A content that starts inside the shared prefix (a generation prompt ending in
        // "<think>\n" that the full rendering shares with the reasoning) still matches.
        let think = [
            m(Role::User, "q"),
            m(Role::Assistant, "<think>\nr\n</think>\n\nok"),
        ];
        let text = "q|A:<think>\nr\n</think>\n\nok|";
        let anchor = "q|A:<think>\n".len();
        assert_eq!(
            find_content_spans(&think, text, &[anchor]).unwrap(),
            [Some(4..text.len() - 1)]
        );
        // A content only rendered before the anchor is not found.
        let e = find_content_spans(&msgs[..2], "Pick a or b.|assistant:|", &[23]).unwrap_err();
        assert_eq!(e, SkipReason::ContentNotFound { message: 1 });
    }

    #[test]
    fn common_prefix_stops_on_a_character_boundary() {
        assert_eq!(common_prefix("abc", "abd"), 2);
        assert_eq!(common_prefix("ab", "abc"), 2);
        // 'é' (C3 A9) and 'ê' (C3 AA) share their first byte.
        assert_eq!(common_prefix("xé", "xê"), 1);
        assert_eq!(ceil_boundary("xé", 2), 3);
        assert_eq!(ceil_boundary("xé", 9), 3);
    }
}

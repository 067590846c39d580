//! The regeneration loop: a reader thread turns rows into prompts ahead of the generation
//! (through a bounded channel), the generation pulls them as slots free up, and each
//! finished sequence goes to the output at once.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, sync_channel};

use dflash_models::generate::{Finish, GenerateOptions, Generated, Prompt, generate};
use dflash_models::{ModelError, Qwen3Target};
use dflash_prepare::{Input, Message, PrepareError, Preparer, parse_conversation};
use indicatif::ProgressBar;
use serde_json::{Value, json};

use crate::output::Output;
use crate::prompt::{prompt_ids, prompt_turns};
use crate::{RegenerateError, Summary};

/// Rows handed to the reader at a time, and prompts the channel holds ahead.
const CHUNK: usize = 256;
const AHEAD: usize = 1024;

/// A sample on its way from the reader thread.
enum Item {
    Prompt(Prompt, Vec<Message>),
    Skip(u64, String),
    Resumed,
    Failed(PrepareError),
}

/// What the prompt feed and the finish callback share (both run on the generating thread,
/// never at once).
#[derive(Default)]
struct Shared {
    /// The prompt turns of the sequences in flight, for their output lines.
    turns: HashMap<u64, Vec<Message>>,
    summary: Summary,
    /// The reader's error, or the output's: the generation is stopped and this reported.
    failed: Option<RegenerateError>,
}

pub(crate) fn run(
    target: &Qwen3Target,
    preparer: &Preparer,
    input: &Input,
    opts: &GenerateOptions,
    out: &mut Output,
    progress: bool,
) -> Result<Summary, RegenerateError> {
    let bar = progress_bar(progress, input.rows_hint());
    let shared = RefCell::new(Shared::default());
    let done_before = out.done().clone();
    let capacity = opts.capacity;
    let (tx, rx) = sync_channel::<Item>(AHEAD);
    let result = std::thread::scope(|scope| {
        let reader = scope.spawn(move || {
            let read = input.for_each_chunk(CHUNK, &mut |rows| {
                for (i, v) in rows {
                    let item = if done_before.contains(&i) {
                        Item::Resumed
                    } else {
                        to_prompt(preparer, i, &v, capacity)
                    };
                    if tx.send(item).is_err() {
                        break; // the generation stopped: nothing more to read
                    }
                }
                Ok(())
            });
            if let Err(e) = read {
                let _ = tx.send(Item::Failed(e));
            }
        });
        let mut feed = Feed {
            rx: &rx,
            shared: &shared,
            bar: &bar,
        };
        let result = generate(target, opts, &mut feed, &mut |g, stats| {
            let mut sh = shared.borrow_mut();
            let turns = sh.turns.remove(&g.id).unwrap_or_default();
            let line = match output_line(preparer, &g, &turns) {
                Ok(line) => line,
                Err(reason) => {
                    sh.summary.skipped.push((g.id, reason));
                    bar.inc(1);
                    return Ok(());
                }
            };
            if let Err(e) = out.write(g.id, &line) {
                sh.failed = Some(e);
                return Err(ModelError::Input("the output could not be written".into()));
            }
            sh.summary.record(&g);
            bar.inc(1);
            bar.set_message(format!("{:.0} tok/s", stats.decode_tokens_per_s()));
            Ok(())
        });
        drop(rx); // unblocks the reader if the generation stopped early
        let _ = reader.join();
        result
    });
    bar.finish_and_clear();
    let Shared {
        mut summary,
        failed,
        ..
    } = shared.into_inner();
    if let Some(e) = failed {
        return Err(e);
    }
    summary.stats = result?;
    finish(summary, input)
}

/// A run that read nothing, or skipped everything it had to do, is an error.
fn finish(summary: Summary, input: &Input) -> Result<Summary, RegenerateError> {
    if summary.samples == 0 {
        return Err(PrepareError::Empty {
            path: input.path().to_path_buf(),
        }
        .into());
    }
    if summary.generated == 0 && summary.resumed == 0 {
        return Err(RegenerateError::AllSkipped {
            path: input.path().to_path_buf(),
            total: summary.samples,
            first: summary.skipped.iter().take(10).cloned().collect(),
        });
    }
    Ok(summary)
}

/// The prompt of row `i`, or why it is skipped.
fn to_prompt(preparer: &Preparer, i: u64, v: &Value, capacity: usize) -> Item {
    let turns = match parse_conversation(v)
        .map_err(|r| r.to_string())
        .and_then(prompt_turns)
    {
        Ok(t) => t,
        Err(reason) => return Item::Skip(i, reason),
    };
    match prompt_ids(preparer, &turns) {
        Ok(ids) if ids.len() >= capacity => Item::Skip(
            i,
            format!(
                "the prompt has {} tokens: no room for an answer within the capacity of {capacity}",
                ids.len()
            ),
        ),
        Ok(ids) => Item::Prompt(Prompt { id: i, ids }, turns),
        Err(reason) => Item::Skip(i, reason),
    }
}

/// The conversation with its new assistant turn, as one output line, or why it is skipped:
/// an answer with ids past the tokenizer's vocabulary (a model with a padded embedding can
/// emit them; the tokenizer would drop them silently) or that does not decode would be
/// training text that the target never wrote.
fn output_line(preparer: &Preparer, g: &Generated, turns: &[Message]) -> Result<Value, String> {
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
    let text = tok
        .decode(answer, true)
        .map_err(|e| format!("the target's answer does not decode ({e}): ids {answer:?}"))?;
    let mut messages: Vec<Value> = turns
        .iter()
        .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
        .collect();
    messages.push(json!({"role": "assistant", "content": text}));
    Ok(json!({
        "index": g.id,
        "messages": messages,
        "finish_reason": g.finish.as_str(),
        "prompt_tokens": g.prompt_len,
        "new_tokens": g.tokens.len(),
    }))
}

/// The prompts for [`generate`], from the reader's channel: skipped and resumed samples are
/// counted on the way; the turns of each prompt wait in [`Shared`] for its answer.
struct Feed<'a> {
    rx: &'a Receiver<Item>,
    shared: &'a RefCell<Shared>,
    bar: &'a ProgressBar,
}

impl Iterator for Feed<'_> {
    type Item = Prompt;
    fn next(&mut self) -> Option<Prompt> {
        loop {
            let item = self.rx.recv().ok()?;
            let mut sh = self.shared.borrow_mut();
            if sh.failed.is_some() {
                return None;
            }
            sh.summary.samples += 1;
            match item {
                Item::Prompt(p, turns) => {
                    sh.turns.insert(p.id, turns);
                    return Some(p);
                }
                Item::Skip(i, reason) => sh.summary.skipped.push((i, reason)),
                Item::Resumed => sh.summary.resumed += 1,
                Item::Failed(e) => {
                    sh.summary.samples -= 1;
                    sh.failed = Some(e.into());
                    return None;
                }
            }
            self.bar.inc(1);
        }
    }
}

fn progress_bar(show: bool, rows: Option<u64>) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = rows.map_or_else(ProgressBar::no_length, ProgressBar::new);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} regenerate [{elapsed_precise}] {bar:40} {pos}/{len} samples (eta {eta}) {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

impl Summary {
    fn record(&mut self, g: &Generated) {
        self.generated += 1;
        match g.finish {
            Finish::Eos => self.finished_eos += 1,
            Finish::MaxNewTokens => self.finished_max_new_tokens += 1,
            Finish::Capacity => self.finished_capacity += 1,
        }
    }
}

//! The regeneration loop: a reader thread turns rows into first-turn prompts ahead of the
//! generation (through a bounded channel), the generation pulls prompts as slots free up, a
//! finished turn queues its conversation's next turn (ahead of new samples, so conversations
//! in flight finish first), and a conversation goes to the output once all its turns are
//! written: a restart never finds half a conversation. A dropped sample is recorded beside
//! the output ([`Output::skip`]), so a restart does not generate it again; one whose later
//! turn outgrows the capacity (its prompt, or its answer cut by it) is written up to its
//! last answer instead.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use dflash_models::generate::{
    Finish, GenerateOptions, GenerateStats, Generated, Prompt, generate,
};
use dflash_models::{ModelError, Qwen3Target};
use dflash_prepare::{Input, PrepareError, Preparer, parse_conversation};
use indicatif::ProgressBar;
use serde_json::Value;

use crate::output::Output;
use crate::turns::{Conversation, NoPrompt, answer_text, describe_id, sample_of};
use crate::{RegenerateError, Summary};

/// Rows handed to the reader at a time, and prompts the channel holds ahead.
const CHUNK: usize = 256;
const AHEAD: usize = 1024;

/// A sample on its way from the reader thread.
pub(crate) enum Item {
    /// The first turn's prompt, and the conversation it belongs to.
    Turn(Prompt, Conversation),
    Skip(u64, String),
    /// Handled by an earlier run: written, or dropped (`skipped`).
    Resumed {
        skipped: bool,
    },
    Failed(PrepareError),
}

/// What a run does with what it generates.
pub(crate) struct Settings {
    /// Tokens a sequence holds, prompt and answer (the generation's capacity).
    pub capacity: usize,
    /// Write conversations with an answer cut by `max_new_tokens` or the capacity.
    pub keep_truncated: bool,
    pub progress: bool,
}

/// What the prompt feed and the finish callback share (both run on the generating thread,
/// never at once).
struct Shared<'o> {
    /// Where finished samples go, and the record of dropped ones.
    out: &'o mut Output,
    /// The conversations with a turn in flight, by sample index.
    in_flight: HashMap<u64, Conversation>,
    /// Next turns of conversations in flight, waiting for a slot.
    next: VecDeque<Prompt>,
    summary: Summary,
    /// The reader's error, or the output's: the generation is stopped and this reported.
    failed: Option<RegenerateError>,
}

impl Shared<'_> {
    /// Drops sample `index`, recording it beside the output first: a restart counts it as
    /// handled instead of generating (and dropping) it again.
    fn skip(&mut self, index: u64, reason: String) -> Result<(), RegenerateError> {
        self.out.skip(index, &reason)?;
        self.summary.skipped.push((index, reason));
        Ok(())
    }
}

/// The callback [`generate`] hands each finished sequence to.
type Done<'a> = dyn FnMut(Generated, &GenerateStats) -> dflash_models::Result<()> + 'a;

pub(crate) fn run(
    target: &Qwen3Target,
    preparer: &Preparer,
    input: &Input,
    opts: &GenerateOptions,
    out: &mut Output,
    settings: &Settings,
) -> Result<Summary, RegenerateError> {
    let to_item = |i: u64, v: &Value| first_turn(preparer, i, v, settings.capacity);
    drive(input, preparer, out, settings, &to_item, |prompts, done| {
        generate(target, opts, prompts, done)
    })
}

/// [`run`] with the row-to-prompt step and the generation given (tests drive it with
/// stand-ins): reads `input` on a thread of its own, feeds `generate`, writes the output.
pub(crate) fn drive<G>(
    input: &Input,
    preparer: &Preparer,
    out: &mut Output,
    settings: &Settings,
    to_item: &(dyn Fn(u64, &Value) -> Item + Sync),
    generate: G,
) -> Result<Summary, RegenerateError>
where
    G: FnOnce(
        &mut dyn Iterator<Item = Prompt>,
        &mut Done<'_>,
    ) -> dflash_models::Result<GenerateStats>,
{
    let bar = progress_bar(settings.progress, input.rows_hint());
    let before = Before {
        written: out.done().clone(),
        skipped: out.skipped().clone(),
        first_skipped: out.skipped_first().to_vec(),
    };
    let shared = RefCell::new(Shared {
        out,
        in_flight: HashMap::new(),
        next: VecDeque::new(),
        summary: Summary::default(),
        failed: None,
    });
    let (tx, rx) = sync_channel::<Item>(AHEAD);
    let mut turns = Turns {
        preparer,
        settings,
        bar: &bar,
    };
    let (result, reader) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| read(input, &before, to_item, tx));
        let mut feed = Feed {
            rx: &rx,
            shared: &shared,
            bar: &bar,
        };
        let result = generate(&mut feed, &mut |g, stats| {
            let mut sh = shared.borrow_mut();
            turns.finished(&mut sh, g, stats).map_err(|e| {
                sh.failed = Some(e);
                ModelError::Input("regeneration stopped (its error follows)".into())
            })
        });
        drop(rx); // unblocks the reader if the generation stopped early
        (result, reader.join())
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
    // A later turn's packed id is a number no dataset row carries: named as sample and turn.
    summary.stats = result.map_err(|e| match e {
        ModelError::Sequence { id, detail } => {
            ModelError::Input(format!("{}: {detail}", describe_id(id)))
        }
        e => e,
    })?;
    // A reader that panicked closed the channel as if the dataset had ended.
    if let Err(panic) = reader {
        return Err(RegenerateError::ReaderPanicked {
            path: input.path().to_path_buf(),
            message: panic_message(panic.as_ref()),
        });
    }
    finish(summary, input, &before.first_skipped)
}

/// The samples earlier runs handled.
struct Before {
    written: HashSet<u64>,
    skipped: HashSet<u64>,
    /// The first drops they recorded, `(index, reason)`.
    first_skipped: Vec<(u64, String)>,
}

/// The reader thread: each row as an [`Item`], in order, until the dataset ends or the
/// generation stops taking them.
fn read(
    input: &Input,
    before: &Before,
    to_item: &(dyn Fn(u64, &Value) -> Item + Sync),
    tx: SyncSender<Item>,
) {
    let mut stopped = false;
    let read = input.for_each_chunk(CHUNK, &mut |rows| {
        for (i, v) in rows {
            let item = if before.written.contains(&i) {
                Item::Resumed { skipped: false }
            } else if before.skipped.contains(&i) {
                Item::Resumed { skipped: true }
            } else {
                to_item(i, &v)
            };
            if tx.send(item).is_err() {
                // The generation stopped: reading on would only delay its error.
                stopped = true;
                return Err(PrepareError::Input {
                    path: input.path().to_path_buf(),
                    detail: "reading stopped: the generation ended".into(),
                });
            }
        }
        Ok(())
    });
    if let Err(e) = read
        && !stopped
    {
        let _ = tx.send(Item::Failed(e));
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// A run that read nothing, or whose output holds nothing (every sample skipped, now or by
/// an earlier run), is an error; `first_before` are the earlier run's first drops.
fn finish(
    mut summary: Summary,
    input: &Input,
    first_before: &[(u64, String)],
) -> Result<Summary, RegenerateError> {
    if summary.samples == 0 {
        return Err(PrepareError::Empty {
            path: input.path().to_path_buf(),
        }
        .into());
    }
    // Later turns are skipped or shortened as they finish, out of order.
    summary.skipped.sort_by_key(|s| s.0);
    summary.shortened.sort_by_key(|s| s.0);
    if summary.generated == 0 && summary.resumed == summary.resumed_skipped {
        let before = first_before
            .iter()
            .map(|(i, r)| (*i, format!("{r} (skipped before)")));
        return Err(RegenerateError::AllSkipped {
            path: input.path().to_path_buf(),
            total: summary.samples,
            first: summary
                .skipped
                .iter()
                .cloned()
                .chain(before)
                .take(10)
                .collect(),
        });
    }
    Ok(summary)
}

/// Row `i`'s conversation and its first turn's prompt, or why it is skipped.
fn first_turn(preparer: &Preparer, i: u64, v: &Value, capacity: usize) -> Item {
    let conv = match parse_conversation(v)
        .map_err(|r| r.to_string())
        .and_then(|m| Conversation::new(i, m))
    {
        Ok(c) => c,
        Err(reason) => return Item::Skip(i, reason),
    };
    match conv.next_prompt(preparer, capacity) {
        Ok(p) => Item::Turn(p, conv),
        // Nothing answered yet: nothing to write.
        Err(no) => Item::Skip(i, no.reason()),
    }
}

/// What happens to a finished turn: the conversation's next turn is queued, or the
/// conversation written (whole, or up to its last answer where a later turn outgrows the
/// capacity), or the sample skipped.
struct Turns<'a> {
    preparer: &'a Preparer,
    settings: &'a Settings,
    bar: &'a ProgressBar,
}

impl Turns<'_> {
    /// `Err` only where the run must stop (the output cannot be written).
    fn finished(
        &mut self,
        sh: &mut Shared,
        g: Generated,
        stats: &GenerateStats,
    ) -> Result<(), RegenerateError> {
        let index = sample_of(g.id);
        let mut conv = sh.in_flight.remove(&index).ok_or_else(|| {
            RegenerateError::Input(format!(
                "{} finished, but that sample has no turn in flight",
                describe_id(g.id)
            ))
        })?;
        sh.summary.record_turn(g.finish);
        let label = conv.turn_label();
        if g.finish != Finish::Eos && !self.settings.keep_truncated {
            let reason = format!(
                "{label}the answer was cut by {} at {} tokens (--keep-truncated writes it)",
                g.finish.as_str(),
                g.tokens.len()
            );
            // A later answer cut by the capacity is the conversation outgrowing it, like a
            // later prompt that does not fit (below): the earlier answers stand. An answer
            // cut by max_new_tokens is the answer's own length, and drops its sample.
            if g.finish == Finish::Capacity && conv.answered() > 0 {
                sh.summary.shortened.push((index, reason));
                return self.write(sh, index, &conv, stats);
            }
            sh.summary.truncated += 1;
            return self.skip(sh, index, reason);
        }
        let text = match answer_text(self.preparer, &g) {
            Ok(text) => text,
            Err(reason) => return self.skip(sh, index, format!("{label}{reason}")),
        };
        conv.answer(text, &g);
        if !conv.is_complete() {
            match conv.next_prompt(self.preparer, self.settings.capacity) {
                Ok(p) => {
                    sh.next.push_back(p);
                    sh.in_flight.insert(index, conv);
                    return Ok(());
                }
                // The answers so far are the target's, each after its own earlier ones:
                // training data as they stand, where dropping them would waste their
                // generation (earlier answers grow every later prompt).
                Err(NoPrompt::TooLong(reason)) => sh.summary.shortened.push((index, reason)),
                Err(no) => return self.skip(sh, index, no.reason()),
            }
        }
        self.write(sh, index, &conv, stats)
    }

    /// Writes `conv` (whole, or up to its last answer) as sample `index`'s line.
    fn write(
        &self,
        sh: &mut Shared,
        index: u64,
        conv: &Conversation,
        stats: &GenerateStats,
    ) -> Result<(), RegenerateError> {
        sh.out.write(index, &conv.output_line())?;
        sh.summary.generated += 1;
        self.bar.inc(1);
        self.bar
            .set_message(format!("{:.0} tok/s", stats.decode_tokens_per_s()));
        Ok(())
    }

    fn skip(&self, sh: &mut Shared, index: u64, reason: String) -> Result<(), RegenerateError> {
        sh.skip(index, reason)?;
        self.bar.inc(1);
        Ok(())
    }
}

/// The prompts for [`generate`]: next turns of conversations in flight first, then new
/// samples from the reader's channel (skipped and resumed ones counted on the way).
struct Feed<'a, 'o> {
    rx: &'a Receiver<Item>,
    shared: &'a RefCell<Shared<'o>>,
    bar: &'a ProgressBar,
}

impl Iterator for Feed<'_, '_> {
    type Item = Prompt;
    fn next(&mut self) -> Option<Prompt> {
        loop {
            {
                let mut sh = self.shared.borrow_mut();
                if sh.failed.is_some() {
                    return None;
                }
                if let Some(p) = sh.next.pop_front() {
                    return Some(p);
                }
            }
            let item = self.rx.recv().ok()?;
            let mut sh = self.shared.borrow_mut();
            sh.summary.samples += 1;
            match item {
                Item::Turn(p, conv) => {
                    sh.in_flight.insert(conv.index(), conv);
                    return Some(p);
                }
                Item::Skip(i, reason) => {
                    if let Err(e) = sh.skip(i, reason) {
                        sh.failed = Some(e);
                        return None;
                    }
                }
                Item::Resumed { skipped } => {
                    sh.summary.resumed += 1;
                    sh.summary.resumed_skipped += usize::from(skipped);
                }
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
    fn record_turn(&mut self, finish: Finish) {
        self.turns += 1;
        match finish {
            Finish::Eos => self.finished_eos += 1,
            Finish::MaxNewTokens => self.finished_max_new_tokens += 1,
            Finish::Capacity => self.finished_capacity += 1,
        }
    }
}

#[cfg(test)]
mod tests;

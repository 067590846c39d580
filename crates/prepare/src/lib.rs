//! `dflash prepare`: chat datasets to training data.
//!
//! Reads conversations (OpenAI `messages` with `role` / `content`, or ShareGPT
//! `conversations` with `from` / `value`, an optional top-level `system`) from JSONL, Parquet
//! or an HF `save_to_disk` directory; renders each with the target's chat template as
//! transformers does ([`template`]); tokenizes it with the target's `tokenizer.json`; masks
//! the assistant content ([`mask`]); and writes `input_ids` + `loss_mask` in the
//! `save_to_disk` layout that `dflash train` reads ([`write`]). A sample that cannot be used
//! is skipped and counted with its index and reason; a dataset where all are is an error. A
//! conversation whose rendering drops earlier turns' reasoning is written more than once (see
//! [`Preparer::prepare_conversation`]).

pub mod arrow_json;
pub mod conversation;
pub mod end_of_turn;
mod error;
pub mod mask;
pub mod read;
pub mod template;
pub mod write;

use std::fmt;
use std::path::PathBuf;

use rayon::prelude::*;

pub use conversation::{Message, Role, parse_conversation, parse_sample};
pub use error::{PrepareError, SkipReason};
pub use mask::{Prepared, PreparedConversation, Preparer};
pub use read::Input;
pub use template::ChatTemplate;
pub use write::DatasetWriter;

/// What to prepare.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// Target directory: `tokenizer.json`, `tokenizer_config.json` (its `chat_template`, or a
    /// `chat_template.jinja` beside it).
    pub target: PathBuf,
    /// A chat template file to use instead of the target's (e.g. one with `{% generation %}`
    /// blocks).
    pub chat_template: Option<PathBuf>,
    /// The chat dataset (see [`Input::open`]).
    pub data: PathBuf,
    /// The output directory (must not exist, or be empty).
    pub out: PathBuf,
    /// Upper bounds of the summary's length histogram (the training buckets), in any order.
    pub bucket_bounds: Vec<usize>,
    /// Draw a progress bar on the terminal.
    pub progress: bool,
}

/// Conversations handed to the worker threads at a time.
const CHUNK: usize = 256;

/// What a preparation did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The input files read, in order.
    pub inputs: Vec<PathBuf>,
    /// The global index of each input file's first sample (one per file in `inputs`).
    pub input_starts: Vec<u64>,
    /// Samples read.
    pub samples: usize,
    /// Samples written (with the extra ones of `reasoning_samples`).
    pub written: usize,
    /// Extra samples written for assistant turns whose reasoning the whole conversation's
    /// rendering drops (see [`Preparer::prepare_conversation`]).
    pub reasoning_samples: usize,
    /// Assistant turns with reasoning that no written sample supervises.
    pub reasoning_dropped: usize,
    /// `(sample index, reason)` of every skipped sample, in order.
    pub skipped: Vec<(u64, SkipReason)>,
    /// Tokens written.
    pub tokens: u64,
    /// Tokens with `loss_mask` 1.
    pub supervised: u64,
    pub min_len: usize,
    pub max_len: usize,
    /// `(upper bound, samples)` per length bucket, bounds ascending (as the training batch
    /// plan sorts them); `None` is the bucket past the last bound.
    pub histogram: Vec<(Option<usize>, usize)>,
    /// The data files written.
    pub files: Vec<PathBuf>,
    /// Whether the template's `{% generation %}` blocks defined the masks.
    pub generation_blocks: bool,
    /// The end-of-answer tokens turns are supervised through (none: the content alone).
    pub end_of_turn: Vec<String>,
}

impl Summary {
    /// The input file of sample `index` and its row there (0-based), where the input has
    /// more than one file (a single file's row is the sample index).
    pub fn locate(&self, index: u64) -> Option<(&std::path::Path, u64)> {
        if self.inputs.len() < 2 || self.input_starts.len() != self.inputs.len() {
            return None;
        }
        let file = self
            .input_starts
            .partition_point(|&s| s <= index)
            .checked_sub(1)?;
        Some((&self.inputs[file], index - self.input_starts[file]))
    }

    fn new(bounds: &[usize]) -> Self {
        // A length counts in the first bound at or above it, so the bounds must ascend.
        let mut bounds = bounds.to_vec();
        bounds.sort_unstable();
        bounds.dedup();
        let mut histogram: Vec<(Option<usize>, usize)> =
            bounds.iter().map(|&b| (Some(b), 0)).collect();
        histogram.push((None, 0));
        Summary {
            histogram,
            min_len: usize::MAX,
            ..Default::default()
        }
    }

    fn add(&mut self, s: &Prepared) {
        let n = s.ids.len();
        self.written += 1;
        self.tokens += n as u64;
        self.supervised += s.loss_mask.iter().map(|&m| u64::from(m)).sum::<u64>();
        self.min_len = self.min_len.min(n);
        self.max_len = self.max_len.max(n);
        let k = self
            .histogram
            .iter()
            .position(|(b, _)| b.is_none_or(|b| n <= b))
            .unwrap_or(self.histogram.len() - 1);
        self.histogram[k].1 += 1;
    }

    /// Skips per reason kind, most frequent first.
    pub fn skips_by_kind(&self) -> Vec<(&'static str, usize)> {
        let mut counts: Vec<(&'static str, usize)> = Vec::new();
        for (_, r) in &self.skipped {
            match counts.iter_mut().find(|(k, _)| *k == r.kind()) {
                Some(c) => c.1 += 1,
                None => counts.push((r.kind(), 1)),
            }
        }
        counts.sort_by_key(|c| std::cmp::Reverse(c.1));
        counts
    }

    /// Fraction of written tokens that are supervised.
    pub fn supervised_fraction(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.supervised as f64 / self.tokens as f64
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const LISTED: usize = 10;
        for path in self.inputs.iter().take(LISTED) {
            writeln!(f, "input: {}", path.display())?;
        }
        if self.inputs.len() > LISTED {
            writeln!(
                f,
                "input: ... and {} more files",
                self.inputs.len() - LISTED
            )?;
        }
        writeln!(
            f,
            "samples: {} read, {} written, {} skipped",
            self.samples,
            self.written,
            self.skipped.len()
        )?;
        if self.reasoning_samples > 0 {
            writeln!(
                f,
                "reasoning: {} extra samples for earlier assistant turns whose reasoning the \
                 chat template drops from the whole conversation",
                self.reasoning_samples
            )?;
        }
        if self.reasoning_dropped > 0 {
            writeln!(
                f,
                "warning: {} assistant turns lost their reasoning: the chat template does not \
                 render it, and no sample supervises it",
                self.reasoning_dropped
            )?;
        }
        writeln!(
            f,
            "tokens: {} ({} supervised, {:.1}%), lengths {}..{}, masks from {}",
            self.tokens,
            self.supervised,
            100.0 * self.supervised_fraction(),
            if self.written == 0 { 0 } else { self.min_len },
            self.max_len,
            if self.generation_blocks {
                "the template's generation blocks".to_string()
            } else if self.end_of_turn.is_empty() {
                "assistant content".to_string()
            } else {
                format!(
                    "assistant content through the end of turn ({})",
                    self.end_of_turn.join(" or ")
                )
            }
        )?;
        if !self.generation_blocks && self.end_of_turn.is_empty() {
            writeln!(
                f,
                "warning: the target names no end-of-answer token (eos_token_id in \
                 generation_config.json or config.json, eos_token in tokenizer_config.json): \
                 the ends of answers are not supervised"
            )?;
        }
        writeln!(f, "{:>10} {:>10}", "length", "samples")?;
        let mut prev = 0;
        for &(bound, n) in &self.histogram {
            let label = match bound {
                Some(b) => {
                    prev = b;
                    format!("<={b}")
                }
                None => format!(">{prev}"),
            };
            writeln!(f, "{label:>10} {n:>10}")?;
        }
        for (kind, n) in self.skips_by_kind() {
            writeln!(f, "skipped ({kind}): {n}")?;
        }
        for (i, r) in self.skipped.iter().take(10) {
            match self.locate(*i) {
                Some((path, row)) => {
                    writeln!(f, "  sample {i} ({} row {row}): {r}", path.display())?
                }
                None => writeln!(f, "  sample {i}: {r}")?,
            }
        }
        if self.skipped.len() > 10 {
            writeln!(f, "  ... and {} more", self.skipped.len() - 10)?;
        }
        Ok(())
    }
}

/// Prepares `opts.data` for `opts.target` into `opts.out`.
pub fn prepare(opts: &PrepareOptions) -> Result<Summary, PrepareError> {
    let preparer = Preparer::from_target_dir(&opts.target, opts.chat_template.as_deref())?;
    let input = Input::open(&opts.data)?;
    prepare_with(&preparer, &input, opts)
}

/// [`prepare`] with an already loaded target and input.
pub fn prepare_with(
    preparer: &Preparer,
    input: &Input,
    opts: &PrepareOptions,
) -> Result<Summary, PrepareError> {
    let mut summary = Summary::new(&opts.bucket_bounds);
    summary.inputs = input.files().to_vec();
    summary.generation_blocks = preparer.template().has_generation_blocks();
    summary.end_of_turn = preparer.end_of_turn().to_vec();
    let bar = if opts.progress {
        let bar = match input.rows_hint() {
            Some(n) => indicatif::ProgressBar::new(n),
            None => indicatif::ProgressBar::no_length(),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} prepare [{elapsed_precise}] {bar:40} {pos}/{len} samples ({per_sec}, eta {eta}) {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut writer = DatasetWriter::create(&opts.out)?;
    summary.input_starts = input.for_each_chunk_by_file(CHUNK, &mut |rows| {
        let results: Vec<(u64, Result<PreparedConversation, SkipReason>)> = rows
            .into_par_iter()
            .map(|(i, v)| {
                let r = parse_sample(&v).and_then(|m| preparer.prepare_conversation(&m));
                (i, r)
            })
            .collect();
        for (i, r) in results {
            summary.samples += 1;
            match r {
                Ok(c) => {
                    summary.reasoning_samples += c.samples.len() - 1;
                    summary.reasoning_dropped += c.reasoning_dropped;
                    for p in &c.samples {
                        writer.push(i, p)?;
                        summary.add(p);
                    }
                }
                Err(reason) => summary.skipped.push((i, reason)),
            }
            bar.inc(1);
        }
        bar.set_message(format!("{} skipped", summary.skipped.len()));
        Ok(())
    })?;
    bar.finish_and_clear();
    if summary.samples == 0 {
        return Err(PrepareError::Empty {
            path: input.path().to_path_buf(),
        });
    }
    if summary.written == 0 {
        return Err(PrepareError::AllSkipped {
            path: input.path().to_path_buf(),
            total: summary.samples,
            first: summary.skipped.iter().take(10).cloned().collect(),
        });
    }
    summary.files = writer.finish()?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Prepared {
        Prepared {
            ids: vec![0; n],
            loss_mask: vec![1; n],
        }
    }

    #[test]
    fn histogram_bounds_are_sorted_whatever_their_order() {
        let mut s = Summary::new(&[4096, 1024, 4096]);
        for n in [10, 2000, 5000, 1024] {
            s.add(&sample(n));
        }
        assert_eq!(s.histogram, [(Some(1024), 2), (Some(4096), 1), (None, 1)]);
        let shown = s.to_string();
        assert!(
            shown.contains("<=1024") && shown.contains(">4096"),
            "{shown}"
        );
    }

    #[test]
    fn the_summary_says_what_turns_end_with_and_warns_where_nothing_is_known() {
        let mut s = Summary::new(&[]);
        s.end_of_turn = vec!["<|im_end|>".into(), "<|endoftext|>".into()];
        let shown = s.to_string();
        assert!(
            shown.contains("through the end of turn (<|im_end|> or <|endoftext|>)"),
            "{shown}"
        );
        assert!(!shown.contains("warning"), "{shown}");
        s.end_of_turn.clear();
        let shown = s.to_string();
        assert!(
            shown.contains("warning: the target names no end-of-answer token"),
            "{shown}"
        );
        // Generation blocks decide for themselves.
        s.generation_blocks = true;
        assert!(!s.to_string().contains("warning"), "{}", s);
    }

    #[test]
    fn a_skipped_sample_of_a_many_file_input_names_its_file_and_row() {
        let mut s = Summary::new(&[]);
        s.inputs = vec![
            "d/a.parquet".into(),
            "d/b.parquet".into(),
            "d/c.parquet".into(),
        ];
        // b.parquet is empty: c.parquet starts where b did.
        s.input_starts = vec![0, 5, 5];
        s.skipped = vec![(4, SkipReason::NoAssistant), (7, SkipReason::NoAssistant)];
        let shown = s.to_string();
        assert!(shown.contains("sample 4 (d/a.parquet row 4):"), "{shown}");
        assert!(shown.contains("sample 7 (d/c.parquet row 2):"), "{shown}");
        // One file: the index is the row.
        s.inputs.truncate(1);
        s.input_starts.truncate(1);
        assert_eq!(s.locate(4), None);
        assert!(s.to_string().contains("  sample 4: "));
    }

    #[test]
    fn the_summary_lists_the_inputs_read() {
        let mut s = Summary::new(&[]);
        s.inputs = (0..12)
            .map(|i| PathBuf::from(format!("d/f{i}.parquet")))
            .collect();
        let shown = s.to_string();
        assert!(shown.contains("input: d/f0.parquet\n"), "{shown}");
        assert!(shown.contains("input: d/f9.parquet\n"), "{shown}");
        assert!(!shown.contains("f10.parquet"), "{shown}");
        assert!(shown.contains("... and 2 more files"), "{shown}");
    }
}

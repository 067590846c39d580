//! JSON Lines datasets: one object per line, `{"input_ids": [...], "loss_mask": [...]}`.
//! Both keys are required on every line, as the Arrow reader requires both columns: a line
//! without a usable mask (absent, `null`, misspelt, or an SFT `labels` list in its place) is
//! an error, not "train on every token", which would silently train on system and user
//! tokens. Other keys are ignored; blank lines are skipped (but still counted for line
//! numbers); a leading UTF-8 byte order mark is ignored. The whole file is parsed at open
//! time, and the first bad line fails the open with `path:line: reason`.

use std::path::{Path, PathBuf};

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};

use crate::error::{DataError, SampleProblem};
use crate::{Dataset, Sample};

pub struct JsonlDataset {
    name: String,
    path: PathBuf,
    /// (ids, loss_mask, 1-based line number) per sample.
    samples: Vec<(Vec<u32>, Vec<u8>, usize)>,
}

#[derive(Deserialize)]
struct Line {
    input_ids: Vec<i64>,
    /// Outer `None`: the key is absent; `Some(None)`: `"loss_mask": null`. Kept apart so the
    /// error can say which (a plain `Option` would read both as absent).
    #[serde(default, deserialize_with = "present")]
    loss_mask: Option<Option<Vec<i64>>>,
    /// Only whether it is there (not parsed): SFT data carries its mask as `labels` with -100,
    /// and the error for a missing `loss_mask` then says how to convert it.
    #[serde(default)]
    labels: Option<IgnoredAny>,
}

/// A key that is present deserializes to `Some`, even when its value is `null`.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Why a line has no usable `loss_mask`, with the keys it does have (a misspelt
/// `"loss-mask"` is then visible) and, for SFT `labels`, the conversion.
fn missing_mask(raw: &str, null: bool, has_labels: bool) -> String {
    // Re-parsed only on this error path, so reading a good file costs nothing extra.
    let keys = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(raw)
        .map(|m| m.keys().cloned().collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let what = if null {
        "loss_mask is null"
    } else {
        "missing loss_mask"
    };
    let mut msg = format!(
        "{what} (keys present: [{keys}]); every line needs \"loss_mask\": a list of 0/1 as long \
         as input_ids, 1 on the tokens to train on (the assistant's)"
    );
    if has_labels {
        msg += "; \"labels\" is not read: convert it with loss_mask[i] = 1 if labels[i] != -100 \
                else 0, or build the data from chat data with `dflash prepare`";
    } else {
        msg += "; `dflash prepare` builds it from chat data";
    }
    msg
}

impl JsonlDataset {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref();
        let text = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
        let bad = |line: usize, detail: String| DataError::BadLine {
            path: path.to_path_buf(),
            line,
            detail,
        };
        // A UTF-8 byte order mark (Windows editors, some exporters) is not part of the JSON.
        let body = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&text);
        let mut samples = Vec::new();
        for (k, raw) in body.split(|&b| b == b'\n').enumerate() {
            let line_no = k + 1;
            let raw = std::str::from_utf8(raw)
                .map_err(|e| bad(line_no, format!("not valid UTF-8: {e}")))?;
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let line: Line = serde_json::from_str(raw).map_err(|e| {
                // serde_json says "at line 1 column N" (of this one line): keep the column only.
                let msg = e.to_string();
                let msg = msg
                    .rsplit_once(" at line ")
                    .map_or(msg.as_str(), |(m, _)| m);
                bad(line_no, format!("{msg} (column {})", e.column()))
            })?;
            let mut ids = Vec::with_capacity(line.input_ids.len());
            for (position, &v) in line.input_ids.iter().enumerate() {
                let problem = if v < 0 {
                    SampleProblem::Negative {
                        column: "input_ids",
                        position,
                        value: v as i128,
                    }
                } else if v > u32::MAX as i64 {
                    SampleProblem::TooLarge {
                        column: "input_ids",
                        position,
                        value: v as i128,
                    }
                } else {
                    ids.push(v as u32);
                    continue;
                };
                return Err(bad(line_no, problem.to_string()));
            }
            let mask = match line.loss_mask {
                None | Some(None) => {
                    let null = line.loss_mask.is_some();
                    let detail = missing_mask(raw, null, line.labels.is_some());
                    return Err(bad(line_no, detail));
                }
                Some(Some(m)) => {
                    if m.len() != ids.len() {
                        let p = SampleProblem::LengthMismatch {
                            ids_len: ids.len(),
                            mask_len: m.len(),
                        };
                        return Err(bad(line_no, p.to_string()));
                    }
                    let mut out = Vec::with_capacity(m.len());
                    for (position, &v) in m.iter().enumerate() {
                        if v != 0 && v != 1 {
                            let p = SampleProblem::BadMaskValue {
                                position,
                                value: v as i128,
                            };
                            return Err(bad(line_no, p.to_string()));
                        }
                        out.push(v as u8);
                    }
                    out
                }
            };
            samples.push((ids, mask, line_no));
        }
        Ok(JsonlDataset {
            name: path.display().to_string(),
            path: path.to_path_buf(),
            samples,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// 1-based line number of sample `i` in the file.
    pub fn line_of(&self, i: usize) -> Option<usize> {
        self.samples.get(i).map(|s| s.2)
    }
}

impl Dataset for JsonlDataset {
    fn len(&self) -> usize {
        self.samples.len()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn seq_len(&self, i: usize) -> usize {
        self.samples.get(i).map_or(0, |s| s.0.len())
    }

    fn get(&self, i: usize) -> Result<Sample, DataError> {
        let (ids, loss_mask, _) =
            self.samples
                .get(i)
                .ok_or_else(|| DataError::IndexOutOfRange {
                    name: self.name.clone(),
                    index: i,
                    len: self.samples.len(),
                })?;
        Ok(Sample {
            id: i as u64,
            ids: ids.clone(),
            loss_mask: loss_mask.clone(),
        })
    }
}

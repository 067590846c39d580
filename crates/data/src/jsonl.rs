//! JSON Lines datasets: one object per line, `{"input_ids": [...], "loss_mask": [...]}`.
//! `loss_mask` is optional (all ones when absent); other keys are ignored; blank lines are
//! skipped (but still counted for line numbers); a leading UTF-8 byte order mark is ignored.
//! The whole file is parsed at open time, and
//! the first bad line fails the open with `path:line: reason`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

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
    #[serde(default)]
    loss_mask: Option<Vec<i64>>,
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
                None => vec![1u8; ids.len()],
                Some(m) => {
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

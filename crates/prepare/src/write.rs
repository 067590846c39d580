//! Output in the on-disk layout of HF `datasets` `Dataset.save_to_disk`: Arrow IPC stream
//! shards `data-0000i-of-0000N.arrow` (record batches of at most 1000 rows, as `datasets`
//! writes them; a new shard past about 500 MB, its default `max_shard_size`),
//! `dataset_info.json` and `state.json`, with `input_ids` list<int32> and `loss_mask`
//! list<int8>, as `dflash_data::open_dataset` and `datasets.load_from_disk` read them.
//!
//! Everything is written into a temporary sibling directory that is renamed to the output at
//! the end, so an interrupted run leaves no half-written dataset under the output's name (the
//! next run into the same output removes what it left, see [`DatasetWriter::create`]). An
//! output that already exists as an empty directory (a mount point, say) cannot be replaced
//! that way: the temporary directory is made inside it and its files are moved up at the end,
//! which needs neither removing the output nor a rename across file systems (what a killed
//! run leaves there is removed by the next one, see [`DatasetWriter::create`]). A finished
//! dataset is never deleted: where the final move fails, it is kept where it was written and the
//! error names that place.

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{Int8Builder, Int32Builder, ListBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema};

use crate::error::PrepareError;
use crate::mask::Prepared;

/// Rows per record batch (`datasets`' default `writer_batch_size`).
pub const ROWS_PER_BATCH: usize = 1000;
/// Bytes of token data past which a new shard starts.
pub const SHARD_BYTES: usize = 500 << 20;

pub struct DatasetWriter {
    out: PathBuf,
    tmp: PathBuf,
    /// `out` existed (empty) and `tmp` is inside it: the files are moved up into `out`.
    in_place: bool,
    /// The dataset in `tmp` is complete: kept, whatever becomes of the final move.
    complete: bool,
    /// Temporary directories of interrupted runs removed from `out`.
    removed: Vec<PathBuf>,
    schema: Arc<Schema>,
    shard_bytes: usize,
    shards: Vec<PathBuf>,
    writer: Option<(StreamWriter<BufWriter<File>>, usize)>,
    ids: ListBuilder<Int32Builder>,
    mask: ListBuilder<Int8Builder>,
    pending: usize,
    rows: usize,
}

fn features() -> serde_json::Value {
    let seq = |dtype: &str| serde_json::json!({"feature": {"dtype": dtype, "_type": "Value"}, "_type": "Sequence"});
    serde_json::json!({"input_ids": seq("int32"), "loss_mask": seq("int8")})
}

impl DatasetWriter {
    /// Starts writing the dataset that will be `out`: an error if `out` exists and is not an
    /// empty directory. Temporary directories that an interrupted in-place run left in `out`
    /// do not count: they are removed (and named on stderr), except one holding a finished
    /// dataset or one whose process is still running, which is an error naming it. For a new
    /// `out`, the same goes for the hidden `.NAME.tmp-PID` siblings interrupted runs into it
    /// left beside it.
    pub fn create(out: &Path) -> Result<Self, PrepareError> {
        Self::with_shard_bytes(out, SHARD_BYTES)
    }

    /// As [`create`](Self::create), with another shard size (tests).
    pub fn with_shard_bytes(out: &Path, shard_bytes: usize) -> Result<Self, PrepareError> {
        let in_place = out.exists();
        let removed;
        let tmp = if in_place {
            removed = clear_leftovers(out)?;
            out.join(format!("{IN_PLACE_TMP}{}", std::process::id()))
        } else {
            let name = out
                .file_name()
                .ok_or_else(|| PrepareError::output(out, "the output path has no final component"))?
                .to_string_lossy()
                .into_owned();
            let parent = out
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            std::fs::create_dir_all(parent).map_err(|e| PrepareError::io(parent, e))?;
            let prefix = format!(".{name}.tmp-");
            removed = clear_siblings(parent, &prefix, out)?;
            parent.join(format!("{prefix}{}", std::process::id()))
        };
        std::fs::create_dir(&tmp).map_err(|e| PrepareError::io(&tmp, e))?;
        let hf = serde_json::json!({"info": {"features": features()}}).to_string();
        let schema = Schema::new(vec![
            Field::new(
                "input_ids",
                DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
                true,
            ),
            Field::new(
                "loss_mask",
                DataType::List(Arc::new(Field::new("item", DataType::Int8, true))),
                true,
            ),
        ])
        .with_metadata(std::collections::HashMap::from([(
            "huggingface".to_string(),
            hf,
        )]));
        Ok(DatasetWriter {
            out: out.to_path_buf(),
            tmp,
            in_place,
            complete: false,
            removed,
            schema: Arc::new(schema),
            shard_bytes: shard_bytes.max(1),
            shards: Vec::new(),
            writer: None,
            ids: ListBuilder::new(Int32Builder::new()),
            mask: ListBuilder::new(Int8Builder::new()),
            pending: 0,
            rows: 0,
        })
    }

    /// Appends one sample. `index` names it in the error for a token id past `i32::MAX`.
    pub fn push(&mut self, index: u64, s: &Prepared) -> Result<(), PrepareError> {
        if let Some(&id) = s.ids.iter().find(|&&id| id > i32::MAX as u32) {
            return Err(PrepareError::TokenRange { index, id });
        }
        self.ids.append_value(s.ids.iter().map(|&i| Some(i as i32)));
        self.mask
            .append_value(s.loss_mask.iter().map(|&m| Some(m as i8)));
        self.pending += 1;
        self.rows += 1;
        if self.pending == ROWS_PER_BATCH {
            self.flush_batch()?;
        }
        Ok(())
    }

    /// The temporary directories of interrupted in-place runs that were removed from the
    /// output (see [`create`](Self::create)).
    pub fn removed_leftovers(&self) -> &[PathBuf] {
        &self.removed
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    fn flush_batch(&mut self) -> Result<(), PrepareError> {
        if self.pending == 0 {
            return Ok(());
        }
        let ids: ArrayRef = Arc::new(self.ids.finish());
        let mask: ArrayRef = Arc::new(self.mask.finish());
        let bytes = ids.get_array_memory_size() + mask.get_array_memory_size();
        self.pending = 0;
        let batch = RecordBatch::try_new(self.schema.clone(), vec![ids, mask])
            .map_err(|e| PrepareError::output(&self.tmp, e))?;
        if self.writer.is_none() {
            let path = self.tmp.join(format!("shard-{}.arrow", self.shards.len()));
            let file = File::create(&path).map_err(|e| PrepareError::io(&path, e))?;
            let w = StreamWriter::try_new(BufWriter::new(file), &self.schema)
                .map_err(|e| PrepareError::output(&path, e))?;
            self.shards.push(path);
            self.writer = Some((w, 0));
        }
        let (w, written) = self
            .writer
            .as_mut()
            .expect("a shard writer was just opened");
        let path = self.shards.last().expect("one shard per writer");
        w.write(&batch).map_err(|e| PrepareError::output(path, e))?;
        *written += bytes;
        if *written >= self.shard_bytes {
            self.finish_shard()?;
        }
        Ok(())
    }

    fn finish_shard(&mut self) -> Result<(), PrepareError> {
        if let Some((mut w, _)) = self.writer.take() {
            let path = self.shards.last().expect("one shard per writer");
            w.finish().map_err(|e| PrepareError::output(path, e))?;
            w.into_inner()
                .map_err(|e| PrepareError::output(path, e))?
                .into_inner()
                .map_err(|e| PrepareError::output(path, e.error()))?
                .sync_all()
                .map_err(|e| PrepareError::io(path, e))?;
        }
        Ok(())
    }

    /// Finishes the shards, writes `dataset_info.json` and `state.json` and moves the
    /// dataset to its name. Returns the data files (in their final place).
    pub fn finish(mut self) -> Result<Vec<PathBuf>, PrepareError> {
        self.flush_batch()?;
        if self.shards.is_empty() {
            // An empty dataset is still a valid one: one stream with the schema only.
            let path = self.tmp.join("shard-0.arrow");
            let file = File::create(&path).map_err(|e| PrepareError::io(&path, e))?;
            let w = StreamWriter::try_new(BufWriter::new(file), &self.schema)
                .map_err(|e| PrepareError::output(&path, e))?;
            self.shards.push(path);
            self.writer = Some((w, 0));
        }
        self.finish_shard()?;
        let n = self.shards.len();
        let mut names = Vec::with_capacity(n);
        let mut hash = Fnv::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let name = format!("data-{i:05}-of-{n:05}.arrow");
            let dest = self.tmp.join(&name);
            std::fs::rename(shard, &dest).map_err(|e| PrepareError::io(shard, e))?;
            hash.file(&dest)?;
            names.push(name);
        }
        let info = serde_json::json!({
            "citation": "", "description": "", "features": features(), "homepage": "", "license": ""
        });
        let state = serde_json::json!({
            "_data_files": names.iter().map(|n| serde_json::json!({"filename": n})).collect::<Vec<_>>(),
            "_fingerprint": format!("{:016x}", std::hash::Hasher::finish(&hash.0)),
            "_format_columns": null,
            "_format_kwargs": {},
            "_format_type": null,
            "_output_all_columns": false,
            "_split": null
        });
        for (file, v) in [("dataset_info.json", info), ("state.json", state)] {
            let path = self.tmp.join(file);
            let text = serde_json::to_string_pretty(&v).expect("JSON values serialize");
            std::fs::write(&path, text).map_err(|e| PrepareError::io(&path, e))?;
        }
        self.complete = true;
        let mut files = names.clone();
        // state.json last: a directory without it is visibly not a dataset yet.
        files.extend(["dataset_info.json".to_string(), "state.json".to_string()]);
        self.move_to_out(&files)?;
        Ok(names.iter().map(|n| self.out.join(n)).collect())
    }

    /// Moves the finished dataset (`files` in `tmp`) to `out`; on failure the error names
    /// `tmp`, where what was not moved is kept.
    fn move_to_out(&self, files: &[String]) -> Result<(), PrepareError> {
        let kept = |why: String| {
            PrepareError::output(
                &self.tmp,
                format!(
                    "the finished dataset is kept here because {why}; move {} into {} to use it",
                    if self.in_place { "its files" } else { "it" },
                    self.out.display()
                ),
            )
        };
        if !self.in_place {
            return std::fs::rename(&self.tmp, &self.out)
                .map_err(|e| kept(format!("renaming it to {} failed: {e}", self.out.display())));
        }
        if let Some(f) = files
            .iter()
            .find(|f| self.out.join(f).symlink_metadata().is_ok())
        {
            return Err(kept(format!(
                "{} appeared while preparing",
                self.out.join(f).display()
            )));
        }
        for (k, f) in files.iter().enumerate() {
            std::fs::rename(self.tmp.join(f), self.out.join(f)).map_err(|e| {
                kept(format!(
                    "moving {f} into {} failed: {e} ({k} files were moved before it)",
                    self.out.display()
                ))
            })?;
        }
        // Every file is in place: a leftover empty directory does not make the dataset unusable.
        let _ = std::fs::remove_dir(&self.tmp);
        Ok(())
    }
}

impl Drop for DatasetWriter {
    fn drop(&mut self) {
        // Not finished (an error on the way): leave nothing behind. A complete dataset whose
        // final move failed is kept, and the error names where.
        if !self.complete && self.tmp.exists() {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// The name of the temporary directory an in-place write makes in the output, before the
/// process id.
const IN_PLACE_TMP: &str = ".dflash-prepare.tmp-";

/// Checks that the existing `out` is empty but for temporary directories of interrupted
/// in-place runs, and removes those. A kill leaves such a directory behind, hidden, and it
/// would otherwise block every later run into the same `out`. One is kept, and is an error,
/// where it holds a finished dataset (`state.json`: the final move failed, and the error then
/// named it) or where its process still runs (by `/proc`; without `/proc` every one is taken
/// as left over, as two runs writing into one output at once are not supported). The id of
/// this process is never a running writer: the directory is from an earlier process that had
/// the same id (containers reuse them).
fn clear_leftovers(out: &Path) -> Result<Vec<PathBuf>, PrepareError> {
    let mut ours = Vec::new();
    let mut others = 0usize;
    if out.is_dir() {
        for entry in std::fs::read_dir(out).map_err(|e| PrepareError::io(out, e))? {
            let entry = entry.map_err(|e| PrepareError::io(out, e))?;
            let pid = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(IN_PLACE_TMP))
                .and_then(|p| p.parse::<u32>().ok());
            match pid {
                Some(pid) if entry.path().is_dir() => ours.push((entry.path(), pid)),
                _ => others += 1,
            }
        }
    }
    if !out.is_dir() || others > 0 {
        let leftovers: Vec<String> = ours.iter().map(|(p, _)| p.display().to_string()).collect();
        return Err(PrepareError::output(
            out,
            format!(
                "already exists and is not an empty directory (remove it or choose another \
                 --out){}",
                if leftovers.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; it also holds {}, left by an interrupted dflash prepare",
                        leftovers.join(", ")
                    )
                }
            ),
        ));
    }
    remove_stale(out, ours)
}

/// The `PREFIX<pid>` directories in `parent`, temporary directories of interrupted runs into
/// the new output `out`, removed as [`clear_leftovers`] removes those of in-place runs: a kill
/// leaves them, hidden, beside the output, each as large as the data written before it.
fn clear_siblings(parent: &Path, prefix: &str, out: &Path) -> Result<Vec<PathBuf>, PrepareError> {
    let mut ours = Vec::new();
    for entry in std::fs::read_dir(parent).map_err(|e| PrepareError::io(parent, e))? {
        let entry = entry.map_err(|e| PrepareError::io(parent, e))?;
        let pid = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && entry.path().is_dir()
        {
            ours.push((entry.path(), pid));
        }
    }
    remove_stale(out, ours)
}

/// Removes the temporary directories `ours` (with the ids of the processes that made them) of
/// runs into `out`; an error, removing none, where one holds a finished dataset or its process
/// still runs.
fn remove_stale(out: &Path, ours: Vec<(PathBuf, u32)>) -> Result<Vec<PathBuf>, PrepareError> {
    let proc = Path::new("/proc");
    let running = |pid: u32| {
        pid != std::process::id()
            && proc.join("self").exists()
            && proc.join(pid.to_string()).exists()
    };
    for (dir, pid) in &ours {
        if dir.join("state.json").exists() {
            return Err(PrepareError::output(
                dir,
                format!(
                    "holds a finished dataset of an earlier run whose final move failed: move \
                     it (or its files) to {} to use it, or remove it",
                    out.display()
                ),
            ));
        }
        if running(*pid) {
            return Err(PrepareError::output(
                dir,
                format!(
                    "another dflash prepare (process {pid}) is writing into {}; if process \
                     {pid} is not one, remove this directory",
                    out.display()
                ),
            ));
        }
    }
    let mut removed = Vec::with_capacity(ours.len());
    for (dir, _) in ours {
        std::fs::remove_dir_all(&dir).map_err(|e| PrepareError::io(&dir, e))?;
        eprintln!(
            "removed {}, left by an interrupted dflash prepare",
            dir.display()
        );
        removed.push(dir);
    }
    Ok(removed)
}

/// FNV-1a over the data files: a content fingerprint like the one `datasets` keeps, so two
/// identical preparations have the same `_fingerprint`.
#[derive(Default)]
struct Fnv(dflash_data::rng::Fnv1a);

impl Fnv {
    fn new() -> Self {
        Fnv::default()
    }
    fn file(&mut self, path: &Path) -> Result<(), PrepareError> {
        let mut f = File::open(path).map_err(|e| PrepareError::io(path, e))?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = f.read(&mut buf).map_err(|e| PrepareError::io(path, e))?;
            if n == 0 {
                return Ok(());
            }
            std::hash::Hasher::write(&mut self.0, &buf[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn sample() -> Prepared {
        Prepared {
            ids: vec![1, 2, 3],
            loss_mask: vec![0, 1, 1],
        }
    }

    /// A temporary directory of a killed in-place run of process `pid`, with a half-written
    /// shard.
    fn leftover(out: &Path, pid: u32) -> PathBuf {
        let dir = out.join(format!("{IN_PLACE_TMP}{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("shard-0.arrow"), "half").unwrap();
        dir
    }

    #[test]
    fn what_a_killed_in_place_run_left_is_removed_by_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("mnt");
        std::fs::create_dir(&out).unwrap();
        // A process id that no process has (above Linux's pid_max), and this process's own
        // (an earlier process with the same id).
        let dead = leftover(&out, 999_999_999);
        let same = leftover(&out, std::process::id());
        let mut w = DatasetWriter::create(&out).unwrap();
        let mut removed = w.removed_leftovers().to_vec();
        removed.sort();
        let mut want = vec![dead, same];
        want.sort();
        assert_eq!(removed, want);
        w.push(0, &sample()).unwrap();
        w.finish().unwrap();
        assert_eq!(
            names_in(&out),
            [
                "data-00000-of-00001.arrow",
                "dataset_info.json",
                "state.json"
            ]
        );
    }

    #[test]
    fn a_leftover_is_kept_and_named_where_it_may_still_be_needed() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("mnt");
        std::fs::create_dir(&out).unwrap();
        let err = |out: &Path| DatasetWriter::create(out).err().unwrap().to_string();

        // A finished dataset whose final move failed.
        let finished = leftover(&out, 999_999_999);
        std::fs::write(finished.join("state.json"), "{}").unwrap();
        let e = err(&out);
        assert!(e.contains("holds a finished dataset"), "{e}");
        assert!(e.contains(&*finished.to_string_lossy()), "{e}");
        assert!(finished.join("state.json").exists());
        std::fs::remove_dir_all(&finished).unwrap();

        // A run still writing (process 1 always runs).
        if Path::new("/proc/self").exists() {
            let running = leftover(&out, 1);
            let e = err(&out);
            assert!(e.contains("(process 1) is writing"), "{e}");
            assert!(running.join("shard-0.arrow").exists());
            std::fs::remove_dir_all(&running).unwrap();
        }

        // Beside anything else, the directory is not empty; the leftover is named.
        let stale = leftover(&out, 999_999_999);
        std::fs::write(out.join("notes.txt"), "x").unwrap();
        let e = err(&out);
        assert!(e.contains("not an empty directory"), "{e}");
        assert!(e.contains(&*stale.to_string_lossy()), "{e}");
        assert!(stale.exists());
        // A name like ours but not a process id is not ours.
        std::fs::remove_file(out.join("notes.txt")).unwrap();
        std::fs::create_dir(out.join(format!("{IN_PLACE_TMP}x1"))).unwrap();
        assert!(err(&out).contains("not an empty directory"));
    }

    /// A new output: killed runs into it left `.NAME.tmp-PID` beside it, which the next run
    /// removes, keeping those that may still be needed and the directories of other outputs.
    #[test]
    fn what_a_killed_run_into_a_new_output_left_beside_it_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let dead = tmp.path().join(".out.tmp-999999999");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("shard-0.arrow"), "half").unwrap();
        let other = tmp.path().join(".other.tmp-999999999");
        std::fs::create_dir(&other).unwrap();
        let mut w = DatasetWriter::create(&out).unwrap();
        assert_eq!(w.removed_leftovers(), std::slice::from_ref(&dead));
        assert!(!dead.exists() && other.exists());
        w.push(0, &sample()).unwrap();
        w.finish().unwrap();
        assert_eq!(names_in(tmp.path()), [".other.tmp-999999999", "out"]);

        // One whose process still runs (process 1 always does) is an error naming it.
        if Path::new("/proc/self").exists() {
            let running = tmp.path().join(".new.tmp-1");
            std::fs::create_dir(&running).unwrap();
            let e = DatasetWriter::create(&tmp.path().join("new"))
                .err()
                .unwrap();
            let e = e.to_string();
            assert!(e.contains("(process 1) is writing"), "{e}");
            assert!(running.exists());
        }
    }
}

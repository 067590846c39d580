//! A cheap fingerprint of the frozen target's files, so that ranks on different hosts can
//! tell that they loaded the same model: two checkpoints at the same path on two nodes (a
//! stale copy, another fine-tune) would otherwise make every rank's features differ without
//! a word.
//!
//! Reading 16 GB on every rank to hash it would cost seconds of every start, so the
//! fingerprint is sampled: each file's name and length, its first MiB (the safetensors
//! header: names, dtypes, shapes and offsets, and the first weights) and 16 windows of 64 KiB
//! spread over the rest. Another fine-tune differs in every window; a difference confined to
//! bytes between windows goes unseen, which is the price of a check that runs on every start.
//! `config.json` is read whole, without the keys that only say where and by which library
//! version a copy was saved (`_name_or_path`, `transformers_version`), keys and spacing
//! normalised.

use std::hash::Hasher;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use dflash_data::rng::Fnv1a;

use crate::job::TargetSource;

/// Bytes read from the start of each file: the header and the first weights.
const HEAD: u64 = 1 << 20;
/// Windows of [`WINDOW`] bytes read at evenly spaced offsets past the head.
const WINDOWS: u64 = 16;
const WINDOW: u64 = 64 << 10;

/// What identifies `target` across ranks: the random draw's seed and shape, or the sampled
/// digest of the checkpoint directory's `config.json` and `*.safetensors` files (their count
/// and total size in front, so a difference is readable before the digest). A file that
/// cannot be read is named in the value, which then differs from a rank that could read it.
pub(crate) fn target_fingerprint(target: &TargetSource) -> String {
    match target {
        TargetSource::Random { config, seed } => format!("random weights, seed {seed}, {config:?}"),
        TargetSource::Dir(dir) => dir_fingerprint(dir),
    }
}

fn dir_fingerprint(dir: &Path) -> String {
    let mut files: Vec<_> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().is_some_and(|n| n == "config.json")
                    || p.extension().is_some_and(|e| e == "safetensors")
            })
            .collect(),
        Err(e) => return format!("{}: unreadable ({e})", dir.display()),
    };
    files.sort();
    let mut h = Fnv1a::default();
    let mut total = 0u64;
    for path in &files {
        match sample_file(path, &mut h) {
            Ok(len) => total += len,
            Err(e) => return format!("{}: unreadable ({e})", path.display()),
        }
    }
    format!(
        "{} files, {total} bytes, sampled digest {:016x}",
        files.len(),
        h.finish()
    )
}

/// Keys of `config.json` that say where and by which library version a copy was saved, not
/// what the model is: two downloads of one model may differ in them.
fn cosmetic(key: &str) -> bool {
    key.starts_with('_') || key == "transformers_version"
}

/// `config.json` without its cosmetic keys, keys sorted at every level, spacing gone: the
/// same model's config reads the same however it was saved. Not JSON: its bytes.
fn config_digest_bytes(bytes: &[u8]) -> Vec<u8> {
    fn canonical(v: &serde_json::Value, top: bool, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().filter(|k| !(top && cosmetic(k))).collect();
                keys.sort();
                out.push('{');
                for k in keys {
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push(':');
                    canonical(&m[k.as_str()], false, out);
                    out.push(',');
                }
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for v in a {
                    canonical(v, false, out);
                    out.push(',');
                }
                out.push(']');
            }
            v => out.push_str(&v.to_string()),
        }
    }
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) => {
            let mut out = String::new();
            canonical(&v, true, &mut out);
            out.into_bytes()
        }
        Err(_) => bytes.to_vec(),
    }
}

/// Feeds `path`'s name, length, head and windows to `h` and returns the length
/// (`config.json`: its content without cosmetic keys, [`config_digest_bytes`], and that
/// content's length).
fn sample_file(path: &Path, h: &mut Fnv1a) -> std::io::Result<u64> {
    if let Some(name) = path.file_name() {
        h.write(name.as_encoded_bytes());
    }
    if path.file_name().is_some_and(|n| n == "config.json") {
        let canonical = config_digest_bytes(&std::fs::read(path)?);
        h.write(&canonical);
        return Ok(canonical.len() as u64);
    }
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    h.write(&len.to_le_bytes());
    let mut buf = Vec::new();
    let mut read_at = |offset: u64, n: u64, buf: &mut Vec<u8>| -> std::io::Result<()> {
        buf.clear();
        f.seek(SeekFrom::Start(offset))?;
        (&mut f).take(n).read_to_end(buf)?;
        Ok(())
    };
    read_at(0, HEAD, &mut buf)?;
    h.write(&buf);
    if len > HEAD {
        let span = len - HEAD;
        for k in 0..WINDOWS {
            let offset = HEAD + span * k / WINDOWS;
            read_at(offset, WINDOW.min(len - offset), &mut buf)?;
            h.write(&buf);
        }
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) {
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    /// Same files: same value. A byte changed in the head or in a window, a file renamed, a
    /// file missing: another value. Files other than the config and the weights do not count.
    #[test]
    fn the_fingerprint_follows_the_config_and_weights() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let weights: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for d in [a.path(), b.path()] {
            write(d, "config.json", b"{\"hidden_size\": 64}");
            write(d, "model-00001-of-00002.safetensors", &weights);
            write(d, "model-00002-of-00002.safetensors", &weights[..1000]);
        }
        write(a.path(), "README.md", b"one");
        write(b.path(), "README.md", b"two");
        let fp = |d: &Path| target_fingerprint(&TargetSource::Dir(d.to_path_buf()));
        let base = fp(a.path());
        assert_eq!(base, fp(b.path()));
        assert!(base.starts_with("3 files, 3001019 bytes"), "{base}");

        // The first window past the head starts at HEAD exactly.
        let mut changed = weights.clone();
        changed[HEAD as usize] ^= 1;
        write(b.path(), "model-00001-of-00002.safetensors", &changed);
        assert_ne!(base, fp(b.path()), "a byte in a window");
        changed[HEAD as usize] ^= 1;
        changed[17] ^= 1;
        write(b.path(), "model-00001-of-00002.safetensors", &changed);
        assert_ne!(base, fp(b.path()), "a byte of the head");
        write(b.path(), "model-00001-of-00002.safetensors", &weights);
        assert_eq!(base, fp(b.path()));

        write(b.path(), "config.json", b"{\"hidden_size\": 65}");
        assert_ne!(base, fp(b.path()), "the config");
        // Where and by which version a copy was saved, key order and spacing: the same model.
        write(
            b.path(),
            "config.json",
            b"{ \"transformers_version\": \"4.57.1\", \"_name_or_path\": \"/data/q\",\n  \"hidden_size\": 64 }",
        );
        assert_eq!(base, fp(b.path()), "cosmetic keys");
        write(b.path(), "config.json", b"{\"hidden_size\": 64}");
        std::fs::remove_file(b.path().join("model-00002-of-00002.safetensors")).unwrap();
        assert_ne!(base, fp(b.path()), "a shard missing");

        let gone = a.path().join("nowhere");
        assert!(fp(&gone).contains("unreadable"), "{}", fp(&gone));
    }
}

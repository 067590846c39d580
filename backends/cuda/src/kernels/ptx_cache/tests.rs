use std::cell::Cell;
use std::ffi::OsString;

use super::*;

const PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n// body\n";

/// A compile closure that counts its calls and gives `ptx`.
fn counting<'a>(calls: &'a Cell<u32>, ptx: &'a str) -> impl FnOnce() -> Result<String, String> {
    move || {
        calls.set(calls.get() + 1);
        Ok(ptx.to_string())
    }
}

#[test]
fn a_second_request_reads_the_entry_instead_of_compiling() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::at(dir.path().join("nested/kernels"));
    let calls = Cell::new(0);
    let k = key(&[b"source", b"--gpu-architecture=compute_90", b"12.8"]);
    let first = cache.get_or_compile("norm.cu", "compute_90", k, counting(&calls, PTX));
    assert_eq!(first.unwrap(), PTX);
    assert_eq!(calls.get(), 1);
    let entry = cache.entry("norm.cu", "compute_90", k);
    assert!(entry.is_file(), "no entry at {}", entry.display());
    let again = cache.get_or_compile("norm.cu", "compute_90", k, counting(&calls, "other"));
    assert_eq!(again.unwrap(), PTX, "the entry is what was compiled");
    assert_eq!(calls.get(), 1, "a hit compiles nothing");
    // No temporary file is left beside the entry.
    let names: Vec<_> = std::fs::read_dir(entry.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [entry.file_name().unwrap()]);
}

#[test]
fn every_part_of_the_key_counts() {
    let base = key(&[b"source", b"opts", b"12.8"]);
    for other in [
        key(&[b"source!", b"opts", b"12.8"]),
        key(&[b"source", b"opts2", b"12.8"]),
        key(&[b"source", b"opts", b"12.9"]),
        // Parts run together differently: length-prefixed, so not alike.
        key(&[b"sourc", b"eopts", b"12.8"]),
    ] {
        assert_ne!(base, other);
    }
    assert_eq!(
        base,
        key(&[b"source", b"opts", b"12.8"]),
        "stable in a process"
    );
    let cache = PtxCache::at("/c");
    assert_ne!(
        cache.entry("norm.cu", "compute_90", base),
        cache.entry("norm.cu", "compute_80", base)
    );
    assert_ne!(
        cache.entry("norm.cu", "compute_90", base),
        cache.entry("rope.cu", "compute_90", base)
    );
}

#[test]
fn a_torn_or_edited_entry_is_a_miss_and_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::at(dir.path());
    let k = key(&[b"s"]);
    let entry = cache.entry("loss.cu", "compute_90", k);
    PtxCache::write(&entry, PTX).unwrap();
    let whole = std::fs::read_to_string(&entry).unwrap();
    assert_eq!(PtxCache::read(&entry).as_deref(), Some(PTX));
    let torn = &whole[..whole.len() - 10];
    let edited = whole.replace("body", "bodY");
    for bad in [torn, edited.as_str(), "", "\n", PTX] {
        std::fs::write(&entry, bad).unwrap();
        assert_eq!(PtxCache::read(&entry), None, "{bad:?} read as an entry");
        let calls = Cell::new(0);
        let got = cache.get_or_compile("loss.cu", "compute_90", k, counting(&calls, PTX));
        assert_eq!((got.unwrap().as_str(), calls.get()), (PTX, 1));
        assert_eq!(PtxCache::read(&entry).as_deref(), Some(PTX), "rewritten");
    }
}

#[test]
fn a_failed_compilation_writes_nothing_and_returns_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::at(dir.path());
    let k = key(&[b"s"]);
    let got = cache.get_or_compile("bad.cu", "compute_90", k, || Err::<String, _>("log"));
    assert_eq!(got, Err("log"));
    assert!(!cache.entry("bad.cu", "compute_90", k).exists());
}

#[test]
fn an_unwritable_cache_still_gives_the_compiled_ptx() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the directory should be: every write fails.
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, "x").unwrap();
    let cache = PtxCache::at(blocked.join("kernels"));
    let calls = Cell::new(0);
    let got = cache.get_or_compile("norm.cu", "compute_90", 7, counting(&calls, PTX));
    assert_eq!((got.unwrap().as_str(), calls.get()), (PTX, 1));
}

#[test]
fn the_directory_comes_from_the_variable_then_xdg_then_home() {
    let os = |s: &str| Some(OsString::from(s));
    let at = |d: &str| Some(PtxCache::at(d));
    assert_eq!(PtxCache::resolve(os("/k"), os("/x"), os("/h")), at("/k"));
    assert_eq!(PtxCache::resolve(os("off"), os("/x"), os("/h")), None);
    assert_eq!(PtxCache::resolve(os("0"), None, os("/h")), None);
    assert_eq!(
        PtxCache::resolve(None, os("/x"), os("/h")),
        at("/x/dflash/kernels")
    );
    assert_eq!(
        PtxCache::resolve(os(""), os(""), os("/h")),
        at("/h/.cache/dflash/kernels")
    );
    assert_eq!(PtxCache::resolve(None, None, None), None);
}

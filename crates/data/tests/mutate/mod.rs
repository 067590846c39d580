//! Input mutation for the fuzz properties of every crate (`crates/*/tests/fuzz.rs`, which
//! include this file by path): a valid seed file with a few random edits (bit flips, bytes
//! set, runs inserted, removed or repeated, a truncation, format tokens and extreme
//! little-endian lengths spliced in), or bytes with no structure at all.
//!
//! A property runs `DFLASH_FUZZ_CASES` cases (default [`DEFAULT_CASES`], the bounded CI
//! run); the long run sets it high, e.g. `DFLASH_FUZZ_CASES=2000000 cargo test --release
//! --test fuzz`. No failure file is written into the source tree: a failing case is printed
//! (minimised) in the test's output.
#![allow(dead_code)] // each fuzz target uses its part

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;

/// Cases per property in a plain `cargo test`.
pub const DEFAULT_CASES: u32 = 256;

/// The runner config: `DFLASH_FUZZ_CASES` cases, no persistence.
pub fn config() -> Config {
    let cases = std::env::var("DFLASH_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    Config {
        cases,
        failure_persistence: None,
        // Shrinking a rare failure must not take longer than finding it.
        max_shrink_iters: 2048,
        ..Config::default()
    }
}

/// Tokens of the formats under test (JSON, TOML, Arrow and safetensors headers), spliced
/// in whole: a random byte rarely makes one.
const TOKENS: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"=",
    b"\n",
    b"\\",
    b"\\u0000",
    b"\xef\xbb\xbf",
    b"\xff\xfe",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"-0",
    b"1e400",
    b"-1e400",
    b"NaN",
    b"inf",
    b"1.5",
    b"4294967296",
    b"18446744073709551615",
    b"18446744073709551616",
    b"99999999999999999999999",
    b"\"\"",
    b"[]",
    b"{}",
    b"[[",
    b"\"input_ids\"",
    b"\"loss_mask\"",
    b"\"dtype\"",
    b"\"F32\"",
    b"\"BF16\"",
    b"\"shape\"",
    b"\"data_offsets\"",
    b"[0,0]",
    b"[1,18446744073709551615]",
    b"\"_data_files\"",
    b"ARROW1",
    b"\xff\xff\xff\xff",
    b"[train]",
    b"[data]",
    b"[[x]]",
    b"max_len = ",
    b"step",
    b"\"step\"",
    b"num_hidden_layers",
];

/// Little-endian integers that break length and offset fields.
const EXTREMES: &[u64] = &[
    0,
    1,
    0x7f,
    0xff,
    0x7fff_ffff,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];

#[derive(Debug, Clone)]
enum Edit {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
    Repeat(Index, usize, usize),
    Truncate(Index),
    Token(Index, Index),
    Extreme(Index, Index, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, v)| Edit::Insert(i, v)),
        (any::<Index>(), 1usize..64).prop_map(|(i, n)| Edit::Remove(i, n)),
        (any::<Index>(), 1usize..32, 1usize..8).prop_map(|(i, n, k)| Edit::Repeat(i, n, k)),
        any::<Index>().prop_map(Edit::Truncate),
        (any::<Index>(), any::<Index>()).prop_map(|(i, t)| Edit::Token(i, t)),
        (
            any::<Index>(),
            any::<Index>(),
            prop_oneof![Just(1), Just(2), Just(4), Just(8)]
        )
            .prop_map(|(i, e, w)| Edit::Extreme(i, e, w)),
    ]
}

fn apply(bytes: &mut Vec<u8>, e: &Edit) {
    // Positions index the current bytes (one past the end allowed for inserts).
    let at = |i: &Index, len: usize| i.index(len + 1);
    match e {
        Edit::Flip(i, bit) if !bytes.is_empty() => {
            let p = i.index(bytes.len());
            bytes[p] ^= 1 << bit;
        }
        Edit::Set(i, b) if !bytes.is_empty() => {
            let p = i.index(bytes.len());
            bytes[p] = *b;
        }
        Edit::Insert(i, v) => {
            let p = at(i, bytes.len());
            bytes.splice(p..p, v.iter().copied());
        }
        Edit::Remove(i, n) => {
            let p = at(i, bytes.len());
            let end = (p + n).min(bytes.len());
            bytes.drain(p..end);
        }
        Edit::Repeat(i, n, k) => {
            let p = at(i, bytes.len());
            let end = (p + n).min(bytes.len());
            let run = bytes[p..end].to_vec();
            for _ in 0..*k {
                bytes.splice(end..end, run.iter().copied());
            }
        }
        Edit::Truncate(i) => {
            let p = at(i, bytes.len());
            bytes.truncate(p);
        }
        Edit::Token(i, t) => {
            let p = at(i, bytes.len());
            bytes.splice(p..p, t.get(TOKENS).iter().copied());
        }
        Edit::Extreme(i, e, width) => {
            let le = e.get(EXTREMES).to_le_bytes();
            let p = at(i, bytes.len()).min(bytes.len().saturating_sub(*width));
            let end = (p + width).min(bytes.len());
            bytes.splice(p..end, le[..*width].iter().copied());
        }
        Edit::Flip(..) | Edit::Set(..) => {}
    }
}

/// `seed` with 1 to 8 random edits.
pub fn mutated(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(edit(), 1..9).prop_map(move |edits| {
        let mut b = seed.clone();
        for e in &edits {
            apply(&mut b, e);
        }
        b
    })
}

/// Mostly mutations of `seed`, sometimes arbitrary bytes (up to 512).
pub fn input(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        9 => mutated(seed),
        1 => prop::collection::vec(any::<u8>(), 0..512),
    ]
}

/// `input(seed)` as text, invalid UTF-8 replaced (for parsers that take `&str`).
pub fn text_input(seed: &str) -> impl Strategy<Value = String> {
    input(seed.as_bytes().to_vec()).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

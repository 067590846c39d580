//! The KV-cache forward and the batched generation against the plain forward: the cache's
//! logits match `Qwen3Target::logits` on the whole sequence at every position, however the
//! sequence is split into calls and whatever it is batched with; greedy generation equals
//! the naive loop (full forward, argmax, append) token for token; bad calls are errors.
//!
//! Target: `tests/fixtures/qwen3-random` (3 layers, vocab 96, weights ~N(0, 0.1), so logits
//! are far from ties). Tolerance: both paths run the same f32 ops on the reference backend;
//! only the attention kernel (the tiled kernel over the sequence vs the per-row reference
//! kernel over the cache) and GEMM row counts differ, i.e. summation order: ~1e-6 relative.
//! `1e-4` of the logits' scale leaves that two orders of headroom while a wrong position,
//! a stale cache row or a row seeing another slot moves logits by 1e-1 or more.

mod common;

use common::*;
use dflash_models::Qwen3Target;
use dflash_models::generate::{
    Finish, GenerateOptions, Generated, Prompt, Sampling, argmax, generate,
};
use rand::Rng;

fn target() -> Qwen3Target {
    let dir = fixture_dir().join("model");
    Qwen3Target::load(backend(), &dir, &[2]).expect("the fixture target loads")
}

fn ids(n: usize, seed: u64) -> Vec<u32> {
    let mut r = rng(seed);
    (0..n).map(|_| r.random_range(0..96)).collect()
}

/// Logits of the last position of `seq` by the plain forward.
fn full_logits(t: &Qwen3Target, seq: &[u32]) -> Vec<f32> {
    let all = t.logits(seq).unwrap();
    let v = t.config().vocab_size;
    all[(seq.len() - 1) * v..].to_vec()
}

fn check(t: &Qwen3Target, got: &[f32], seq: &[u32], what: &str) {
    let want = full_logits(t, seq);
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * scale,
            "{what}: logit {i}: cache {g} vs full forward {w}"
        );
    }
}

#[test]
fn cached_logits_match_the_full_forward_however_sequences_are_split_and_batched() {
    let t = target();
    let b = t.backend().clone();
    let v = t.config().vocab_size;
    let mut cache = t.kv_cache(3, 24).unwrap();
    let (a, c) = (ids(19, 1), ids(12, 2));
    // Prefill two sequences in one call (slots 2 and 0), then decode both together.
    let h = t.extend(&mut cache, &[(2, &a[..9]), (0, &c[..5])]).unwrap();
    let lg = b.download(&t.head_logits(&h).unwrap()).unwrap();
    check(&t, &lg[..v], &a[..9], "prefill a");
    check(&t, &lg[v..], &c[..5], "prefill c");
    for n in 9..19 {
        let mut batch: Vec<(usize, &[u32])> = vec![(2, &a[n..n + 1])];
        let cn = 5 + (n - 9);
        if cn < c.len() {
            batch.push((0, &c[cn..cn + 1]));
        }
        let h = t.extend(&mut cache, &batch).unwrap();
        let lg = b.download(&t.head_logits(&h).unwrap()).unwrap();
        check(&t, &lg[..v], &a[..=n], &format!("decode a at {n}"));
        if cn < c.len() {
            check(&t, &lg[v..], &c[..=cn], &format!("decode c at {cn}"));
        }
    }
    assert_eq!(
        (cache.len(2), cache.len(0), cache.len(1)),
        (Some(19), Some(12), Some(0))
    );
    assert_eq!(cache.len(3), None, "no slot 3");
    assert!(
        cache.clear(3).is_err(),
        "clearing slot 3 is an error, not a panic"
    );
    // A slot cleared and refilled forgets what it held.
    cache.clear(2).unwrap();
    let h = t.extend(&mut cache, &[(2, &c[..7])]).unwrap();
    check(
        &t,
        &b.download(&t.head_logits(&h).unwrap()).unwrap(),
        &c[..7],
        "refilled slot",
    );
}

/// The naive definition of greedy generation: the whole sequence through the plain forward
/// for every new token.
fn naive_greedy(t: &Qwen3Target, prompt: &[u32], max_new: usize, eos: u32) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max_new {
        let next = argmax(&full_logits(t, &seq));
        out.push(next);
        seq.push(next);
        if next == eos {
            break;
        }
    }
    out
}

fn run(t: &Qwen3Target, opts: &GenerateOptions, prompts: &[Vec<u32>]) -> Vec<Generated> {
    let mut it = prompts.iter().enumerate().map(|(i, p)| Prompt {
        id: i as u64,
        ids: p.clone(),
    });
    let mut done = Vec::new();
    let stats = generate(t, opts, &mut it, &mut |g, _| {
        done.push(g);
        Ok(())
    })
    .unwrap();
    assert_eq!(stats.sequences as usize, prompts.len());
    done.sort_by_key(|g| g.id);
    done
}

#[test]
fn batched_greedy_generation_is_the_naive_loop_token_for_token() {
    let t = target();
    let prompts: Vec<Vec<u32>> = [5, 11, 3, 8, 14]
        .iter()
        .map(|&n| ids(n, n as u64))
        .collect();
    // An EOS the model does emit: the third token of prompt 0's naive answer.
    let eos = naive_greedy(&t, &prompts[0], 3, u32::MAX)[2];
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| naive_greedy(&t, p, 10, eos))
        .collect();
    for (batch, prefill_tokens) in [(1, 64), (2, 64), (5, 64), (3, 6)] {
        let opts = GenerateOptions {
            batch,
            capacity: 32,
            max_new_tokens: 10,
            prefill_tokens,
            eos: vec![eos],
            sampling: Sampling::default(),
        };
        for (g, w) in run(&t, &opts, &prompts).iter().zip(&want) {
            assert_eq!(&g.tokens, w, "batch {batch}, prompt {}", g.id);
            let finish = if w.last() == Some(&eos) {
                Finish::Eos
            } else {
                Finish::MaxNewTokens
            };
            assert_eq!(g.finish, finish, "batch {batch}, prompt {}", g.id);
            assert_eq!(g.prompt_len, prompts[g.id as usize].len());
        }
    }
}

#[test]
fn sampling_is_reproducible_and_independent_of_the_batch() {
    let t = target();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| ids(4 + i, 40 + i as u64)).collect();
    let opts = |batch| GenerateOptions {
        batch,
        capacity: 32,
        max_new_tokens: 12,
        prefill_tokens: 64,
        eos: vec![],
        sampling: Sampling {
            temperature: 1.5,
            top_k: 20,
            top_p: 0.95,
            seed: 9,
        },
    };
    let one = run(&t, &opts(1), &prompts);
    let four = run(&t, &opts(4), &prompts);
    assert_eq!(one, four);
    let greedy: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| naive_greedy(&t, p, 12, 96))
        .collect();
    assert!(
        one.iter().zip(&greedy).any(|(g, w)| &g.tokens != w),
        "temperature 1.5 sampling must not be greedy"
    );
}

#[test]
fn a_full_slot_ends_its_sequence() {
    let t = target();
    let opts = GenerateOptions {
        batch: 2,
        capacity: 10,
        max_new_tokens: 50,
        prefill_tokens: 64,
        eos: vec![],
        sampling: Sampling::default(),
    };
    let prompts = vec![ids(7, 1), ids(9, 2)];
    let got = run(&t, &opts, &prompts);
    // Prompt and answer together hold at most the capacity: 7 + 3 and 9 + 1 tokens.
    assert_eq!((got[0].tokens.len(), got[0].finish), (3, Finish::Capacity));
    assert_eq!((got[1].tokens.len(), got[1].finish), (1, Finish::Capacity));
    // A prompt of the capacity leaves no room for an answer.
    let mut full = [Prompt {
        id: 4,
        ids: ids(10, 3),
    }]
    .into_iter();
    let e = generate(&t, &opts, &mut full, &mut |_, _| Ok(())).unwrap_err();
    assert!(
        e.to_string()
            .contains("sequence 4: its prompt has 10 tokens"),
        "{e}"
    );
}

/// A copy of the fixture target whose final norm weight is NaN: every hidden state the
/// cache returns is NaN, so are the logits.
fn nan_norm_target(dir: &std::path::Path) -> Qwen3Target {
    use dflash_models::safetensors_io::{TensorFiles, write_f32_atomic};
    let src = fixture_dir().join("model");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let files = TensorFiles::open(&src).unwrap();
    let mut tensors = Vec::new();
    for name in files.names() {
        let shape = files.shape(&name).unwrap();
        let mut v = files.read_f32(&name, &shape).unwrap();
        if name == "model.norm.weight" {
            v.fill(f32::NAN);
        }
        tensors.push((name, shape, v));
    }
    write_f32_atomic(&dir.join("model.safetensors"), &tensors, None).unwrap();
    // The loader refuses NaN weights; a NaN forward is what this test is about.
    let _off = dflash_models::finite::LoadCheckOff::new();
    Qwen3Target::load(backend(), dir, &[2]).unwrap()
}

#[test]
fn non_finite_logits_are_an_error_naming_the_sequence_greedy_or_sampled() {
    let dir = tempfile::tempdir().unwrap();
    let t = nan_norm_target(dir.path());
    for sampling in [
        Sampling::default(),
        Sampling {
            temperature: 1.0,
            ..Sampling::default()
        },
    ] {
        let opts = GenerateOptions {
            batch: 2,
            capacity: 16,
            max_new_tokens: 4,
            prefill_tokens: 64,
            eos: vec![],
            sampling,
        };
        let mut prompts = [Prompt {
            id: 5,
            ids: ids(4, 5),
        }]
        .into_iter();
        let mut written = 0;
        let e = generate(&t, &opts, &mut prompts, &mut |_, _| {
            written += 1;
            Ok(())
        })
        .unwrap_err()
        .to_string();
        assert_eq!(written, 0, "{sampling:?}: nothing is handed over");
        assert!(
            e.contains("sequence 5") && e.contains("non-finite"),
            "{sampling:?}: {e}"
        );
    }
}

#[test]
fn bad_calls_are_errors_not_panics() {
    let t = target();
    let mut cache = t.kv_cache(2, 8).unwrap();
    let a = ids(8, 3);
    fn err<T>(r: dflash_models::Result<T>) -> String {
        r.err().expect("must fail").to_string()
    }
    assert!(err(t.extend(&mut cache, &[(2, &a[..1])])).contains("slot 2 of 2"));
    assert!(err(t.extend(&mut cache, &[(0, &a[..1]), (0, &a[..1])])).contains("twice"));
    assert!(err(t.extend(&mut cache, &[(0, &[96])])).contains("outside the vocabulary"));
    t.extend(&mut cache, &[(0, &a[..])]).unwrap();
    assert!(err(t.extend(&mut cache, &[(0, &a[..1])])).contains("does not fit"));
    assert!(err(t.extend(&mut cache, &[(1, &[])])).contains("does not fit"));
    let partial = Qwen3Target::load(backend(), &fixture_dir().join("model"), &[1]).unwrap();
    assert!(err(partial.kv_cache(1, 8)).contains("needs all 3 layers"));
    let mut too_long = [Prompt {
        id: 7,
        ids: ids(9, 4),
    }]
    .into_iter();
    let opts = GenerateOptions {
        batch: 1,
        capacity: 8,
        max_new_tokens: 2,
        prefill_tokens: 64,
        eos: vec![],
        sampling: Sampling::default(),
    };
    let e = generate(&t, &opts, &mut too_long, &mut |_, _| Ok(())).unwrap_err();
    assert!(
        e.to_string()
            .contains("sequence 7: its prompt has 9 tokens"),
        "{e}"
    );
}

/// An absurd `--batch` or capacity: the cache's size is refused as memory no device has
/// (the bytes saturated), not a wrapped product of slots and capacity or an allocator panic.
#[test]
fn a_kv_cache_past_any_memory_is_an_out_of_memory_error_not_a_panic() {
    let t = target();
    // slots x capacity wraps; the product fits but its bytes do not; both past u64 bytes.
    for (slots, capacity) in [(usize::MAX, 2), (usize::MAX / 2, 2), (2, usize::MAX)] {
        match t.kv_cache(slots, capacity) {
            Err(dflash_models::ModelError::Backend(dflash_core::Error::OutOfMemory {
                op,
                requested,
                ..
            })) => assert_eq!(
                (op, requested),
                ("kv_cache", u64::MAX),
                "{slots} x {capacity}"
            ),
            Err(e) => panic!("{slots} x {capacity}: another error: {e}"),
            Ok(_) => panic!("{slots} x {capacity}: a cache was made"),
        }
    }
    let opts = GenerateOptions {
        batch: usize::MAX,
        capacity: 8,
        max_new_tokens: 2,
        prefill_tokens: 64,
        eos: vec![],
        sampling: Sampling::default(),
    };
    let mut prompts = [Prompt {
        id: 0,
        ids: ids(3, 5),
    }]
    .into_iter();
    let e = generate(&t, &opts, &mut prompts, &mut |_, _| Ok(())).unwrap_err();
    assert!(e.to_string().contains("out of device memory"), "{e}");
}

//! Sample validation (keep, truncate, skip with a reason) and the skip counts.

use dflash_data::*;

use crate::support::sample;

#[test]
fn validate_keeps_truncates_and_skips_with_reasons() {
    let ok = sample(0, vec![1, 2, 3, 4], vec![0, 1, 1, 0]);
    assert_eq!(
        validate(ok.clone(), 10, 100, 2, TooLongPolicy::Truncate),
        Verdict::Keep(ok.clone())
    );

    // too long: truncate (default) or skip
    let long = sample(1, (0..10).collect(), vec![1; 10]);
    match validate(long.clone(), 10, 6, 2, TooLongPolicy::default()) {
        Verdict::Truncated {
            sample,
            original_len,
        } => {
            assert_eq!(original_len, 10);
            assert_eq!(sample.ids, vec![0, 1, 2, 3, 4, 5]);
            assert_eq!(sample.loss_mask, vec![1; 6]);
            assert_eq!(sample.id, 1);
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(
        validate(long.clone(), 10, 6, 2, TooLongPolicy::Skip),
        Verdict::Skip {
            id: 1,
            reason: SkipReason::TooLong {
                len: 10,
                max_len: 6
            }
        }
    );

    // too few supervised: no two adjacent supervised positions
    let sparse = sample(2, vec![1; 6], vec![1, 0, 1, 0, 1, 0]);
    let v = validate(sparse, 10, 100, 2, TooLongPolicy::Truncate);
    assert!(
        matches!(
            v,
            Verdict::Skip {
                id: 2,
                reason: SkipReason::TooFewSupervised {
                    supervised: 3,
                    anchor_candidates: 0,
                    ..
                }
            }
        ),
        "{v:?}"
    );
    // ...or fewer than min_supervised
    let few = sample(3, vec![1; 6], vec![0, 0, 1, 1, 1, 0]);
    assert!(
        validate(few.clone(), 10, 100, 3, TooLongPolicy::Truncate)
            .into_sample()
            .is_some()
    );
    assert!(validate(few.clone(), 10, 100, 4, TooLongPolicy::Truncate).is_skip());
    // truncation can remove the supervision: counted as too few supervised, not truncated
    let v = validate(few, 10, 3, 2, TooLongPolicy::Truncate);
    assert!(
        matches!(
            v,
            Verdict::Skip {
                reason: SkipReason::TooFewSupervised { supervised: 1, .. },
                ..
            }
        ),
        "{v:?}"
    );
    // empty sample
    assert!(
        validate(
            sample(4, vec![], vec![]),
            10,
            100,
            0,
            TooLongPolicy::Truncate
        )
        .is_skip()
    );

    // id out of vocab: first offending position kept
    let oov = sample(5, vec![1, 2, 264, 300], vec![1; 4]);
    assert_eq!(
        validate(oov, 264, 100, 2, TooLongPolicy::Truncate),
        Verdict::Skip {
            id: 5,
            reason: SkipReason::IdOutOfVocab {
                position: 2,
                id: 264,
                vocab_size: 264
            }
        }
    );
    assert!(
        validate(
            sample(6, vec![263, 0], vec![1, 1]),
            264,
            100,
            2,
            TooLongPolicy::Truncate
        )
        .into_sample()
        .is_some()
    );

    // length mismatch (hand-built sample)
    let v = validate(
        sample(7, vec![1, 2], vec![1]),
        10,
        100,
        2,
        TooLongPolicy::Truncate,
    );
    assert_eq!(
        v,
        Verdict::Skip {
            id: 7,
            reason: SkipReason::LengthMismatch {
                ids_len: 2,
                mask_len: 1
            }
        }
    );
}

#[test]
fn skip_counts_count_every_reason_and_keep_first_offender() {
    let mut a = SkipCounts::default();
    let samples = vec![
        sample(0, vec![1, 2, 3], vec![1, 1, 1]),    // keep
        sample(1, (0..20).collect(), vec![1; 20]),  // truncated
        sample(2, vec![1, 2, 3], vec![0, 0, 1]),    // too few supervised
        sample(9, vec![1, 999, 3], vec![1, 1, 1]),  // oov
        sample(4, vec![1, 1000, 3], vec![1, 1, 1]), // oov (earlier sample index)
        sample(5, vec![1, 2], vec![1]),             // malformed
    ];
    for s in samples {
        a.record(&validate(s, 500, 10, 2, TooLongPolicy::Truncate));
    }
    let err = DataError::IndexOutOfRange {
        name: "x".into(),
        index: 3,
        len: 1,
    };
    a.record_error(3, &err);
    assert_eq!(
        (
            a.seen,
            a.kept,
            a.too_long_truncated,
            a.too_few_supervised,
            a.id_out_of_vocab,
            a.malformed
        ),
        (7, 2, 1, 1, 2, 2)
    );
    assert_eq!(a.kept + a.skipped(), a.seen);
    let f = a.first_out_of_vocab.unwrap();
    assert_eq!(
        (f.sample, f.position, f.id, f.vocab_size),
        (4, 1, 1000, 500)
    );
    assert_eq!(a.first_malformed.as_ref().unwrap().0, 3);
    let line = a.to_string();
    assert!(
        line.contains("kept 2/7")
            && line.contains("sample 4, position 1, id 1000 >= vocab_size 500"),
        "{line}"
    );

    let mut b = SkipCounts::default();
    b.record(&validate(
        sample(1, vec![7; 30], vec![1; 30]),
        5,
        100,
        2,
        TooLongPolicy::Skip,
    ));
    b.record(&validate(
        sample(2, (0..30).collect(), vec![1; 30]),
        500,
        10,
        2,
        TooLongPolicy::Skip,
    ));
    assert_eq!((b.id_out_of_vocab, b.too_long_skipped), (1, 1));
    a.merge(&b);
    assert_eq!((a.seen, a.id_out_of_vocab, a.too_long_skipped), (9, 3, 1));
    assert_eq!(a.first_out_of_vocab.unwrap().sample, 1);
    assert_eq!(a.kept + a.skipped(), a.seen);
    assert_eq!(SkipCounts::default().to_string(), "kept 0/0");
}

/// Samples kept longer than the target's `max_position_embeddings` (after truncation to
/// `max_len`) are skipped and counted under their own reason; shorter ones are untouched.
#[test]
fn samples_beyond_max_positions_are_skipped_and_counted() {
    let long = sample(3, vec![1; 10], vec![1; 10]);
    let v = validate(long.clone(), 10, 100, 2, TooLongPolicy::Truncate).within_positions(8);
    assert_eq!(
        v,
        Verdict::Skip {
            id: 3,
            reason: SkipReason::BeyondMaxPositions {
                len: 10,
                max_positions: 8
            }
        }
    );
    // Truncated to max_len 8 first: then it fits.
    let v = validate(long.clone(), 10, 8, 2, TooLongPolicy::Truncate).within_positions(8);
    assert!(!v.is_skip());
    let kept = validate(long, 10, 100, 2, TooLongPolicy::Truncate).within_positions(10);
    assert!(!kept.is_skip());
    let mut c = SkipCounts::default();
    c.record(&v);
    c.record(
        &validate(
            sample(4, vec![1; 9], vec![1; 9]),
            10,
            100,
            2,
            TooLongPolicy::Truncate,
        )
        .within_positions(8),
    );
    assert_eq!(
        (c.seen, c.kept, c.skipped(), c.beyond_max_positions),
        (2, 1, 1, 1)
    );
    assert!(
        c.to_string()
            .contains("1 longer than max_position_embeddings"),
        "{c}"
    );
}

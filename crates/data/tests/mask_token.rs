//! Kept samples holding the drafter's mask token id are counted as a warning (not skipped),
//! with the first one named, across merged worker counts.

use dflash_data::{Sample, SkipCounts, TooLongPolicy, validate};

fn sample(id: u64, ids: &[u32]) -> Sample {
    Sample {
        id,
        ids: ids.to_vec(),
        loss_mask: vec![1; ids.len()],
    }
}

#[test]
fn mask_token_in_kept_samples_is_counted_and_the_first_named() {
    const MASK: u32 = 9;
    let mut a = SkipCounts::default();
    let mut b = SkipCounts::default();
    for (first, s) in [
        (true, sample(5, &[1, 2, MASK, 3])),
        (true, sample(6, &[1, 2, 3, 4])),
        (false, sample(2, &[MASK, 1, 2, 3])),
    ] {
        let counts = if first { &mut a } else { &mut b };
        let v = validate(s.clone(), 16, 64, 2, TooLongPolicy::Truncate);
        counts.record(&v);
        let kept = v.into_sample().expect("kept");
        let seen = counts.record_mask_token(&kept, MASK);
        assert_eq!(seen.is_some(), s.ids.contains(&MASK), "sample {}", s.id);
    }
    assert_eq!(
        (a.mask_token_in_data, a.first_mask_token.unwrap().sample),
        (1, 5)
    );
    assert_eq!(a.first_mask_token.unwrap().position, 2);
    a.merge(&b);
    assert_eq!(a.mask_token_in_data, 2);
    assert_eq!(
        a.first_mask_token.unwrap().sample,
        2,
        "the smaller sample index wins"
    );
    assert_eq!((a.kept, a.skipped()), (3, 0), "a warning, not a skip");
    let line = a.to_string();
    assert!(
        line.contains("2 holding the mask token id 9, first: sample 2, position 0"),
        "{line}"
    );
    assert!(!SkipCounts::default().to_string().contains("mask"));
}

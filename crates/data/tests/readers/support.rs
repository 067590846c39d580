//! Shared checks: a dataset's rows against the expected ones, and an error's text.

use dflash_data::{DataError, Dataset, Sample};

pub(crate) fn expect_rows(ds: &dyn Dataset, ids: &[Vec<i64>], mask: &[Vec<i64>]) {
    assert_eq!(ds.len(), ids.len());
    for i in 0..ds.len() {
        let s = ds.get(i).unwrap();
        let want_ids: Vec<u32> = ids[i].iter().map(|&x| x as u32).collect();
        let want_mask: Vec<u8> = mask[i].iter().map(|&x| x as u8).collect();
        assert_eq!(
            s,
            Sample {
                id: i as u64,
                ids: want_ids,
                loss_mask: want_mask
            },
            "sample {i}"
        );
        assert_eq!(ds.seq_len(i), ids[i].len());
    }
    assert_eq!(ds.seq_len(ds.len()), 0);
    assert!(matches!(
        ds.get(ds.len()),
        Err(DataError::IndexOutOfRange { .. })
    ));
}

pub(crate) fn err_string<T>(r: Result<T, DataError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

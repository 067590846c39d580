//! Valid Arrow datasets: every integer element type, list and large list, several files in
//! `state.json` order or globbed, a single file, an empty stream, extra columns.

use dflash_data::{ArrowDataset, DataError, Dataset, SampleProblem, open_dataset};

use crate::common::*;
use crate::support::expect_rows;

#[test]
fn reads_every_integer_type_list_and_large_list() {
    let (ids, mask) = rows(37, 0);
    for large in [false, true] {
        for ids_elem in ALL_INTS {
            for mask_elem in [Elem::I8, Elem::I64, Elem::U8, Elem::Bool, ids_elem] {
                let tmp = tempfile::tempdir().unwrap();
                hf_dir(tmp.path(), 37, ids_elem, mask_elem, large, 10);
                let ds = open_dataset(tmp.path()).unwrap();
                expect_rows(ds.as_ref(), &ids, &mask);
                assert_eq!(ds.name(), tmp.path().display().to_string());
                assert_eq!(
                    ds.lengths(),
                    ids.iter().map(|v| v.len()).collect::<Vec<_>>()
                );
            }
        }
    }
}

#[test]
fn int32_and_int64_like_hf_train_and_eval() {
    // The embedded dataset's two layouts: list<int32>/list<int8> and list<int64>/list<int64>.
    let big: Vec<Vec<i64>> = (0..5)
        .map(|r| (0..50).map(|j| 151_000 + r * 50 + j).collect())
        .collect();
    let mask: Vec<Vec<i64>> = (0..5)
        .map(|_| (0..50).map(|j| (j > 10) as i64).collect())
        .collect();
    for (ie, me) in [
        (Elem::I32, Elem::I8),
        (Elem::I64, Elem::I64),
        (Elem::U32, Elem::U8),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("data-00000-of-00001.arrow");
        write_stream(
            &f,
            &[
                ("input_ids", list_col(&some(&big), ie, false)),
                ("loss_mask", list_col(&some(&mask), me, false)),
            ],
            2,
        );
        write_state(tmp.path(), &["data-00000-of-00001.arrow"]);
        expect_rows(&ArrowDataset::open(tmp.path()).unwrap(), &big, &mask);
    }
}

#[test]
fn multiple_files_in_state_json_order_and_errors_name_the_file_and_row() {
    let tmp = tempfile::tempdir().unwrap();
    let (ids_a, mask_a) = rows(25, 0);
    let (mut ids_b, mask_b) = rows(18, 25);
    ids_b[7][0] = -4; // global sample 25 + 7 = 32, row 7 of file b
    // state.json lists b's name second even though it sorts first.
    let (fa, fb) = ("zz-part-a.arrow", "aa-part-b.arrow");
    write_stream(
        &tmp.path().join(fa),
        &[
            ("input_ids", list_col(&some(&ids_a), Elem::I32, false)),
            ("loss_mask", list_col(&some(&mask_a), Elem::I8, false)),
        ],
        7,
    );
    write_stream(
        &tmp.path().join(fb),
        &[
            ("input_ids", list_col(&some(&ids_b), Elem::I64, true)),
            ("loss_mask", list_col(&some(&mask_b), Elem::I64, true)),
        ],
        4,
    );
    write_state(tmp.path(), &[fa, fb]);
    let ds = ArrowDataset::open(tmp.path()).unwrap();
    assert_eq!(ds.len(), 43);
    assert_eq!(ds.files().len(), 2);
    for i in 0..43 {
        let (ids, mask) = if i < 25 {
            (&ids_a[i], &mask_a[i])
        } else {
            (&ids_b[i - 25], &mask_b[i - 25])
        };
        assert_eq!(ds.seq_len(i), ids.len());
        if i == 32 {
            continue;
        }
        let s = ds.get(i).unwrap();
        assert_eq!(s.id, i as u64);
        assert_eq!(s.ids, ids.iter().map(|&x| x as u32).collect::<Vec<_>>());
        assert_eq!(
            s.loss_mask,
            mask.iter().map(|&x| x as u8).collect::<Vec<_>>()
        );
    }
    let e = ds.get(32).unwrap_err();
    match &e {
        DataError::BadSample {
            path,
            index,
            row,
            problem,
        } => {
            assert!(path.ends_with(fb));
            assert_eq!((*index, *row), (32, 7));
            assert_eq!(
                *problem,
                SampleProblem::Negative {
                    column: "input_ids",
                    position: 0,
                    value: -4
                }
            );
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains(fb) && msg.contains("sample 32") && msg.contains("input_ids[0] = -4"),
        "{msg}"
    );
}

#[test]
fn directory_without_state_json_globs_sorted_arrow_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (ids0, mask0) = rows(5, 0);
    let (ids1, mask1) = rows(6, 5);
    for (name, ids, mask) in [
        ("data-00001-of-00002.arrow", &ids1, &mask1),
        ("data-00000-of-00002.arrow", &ids0, &mask0),
    ] {
        write_stream(
            &tmp.path().join(name),
            &[
                ("input_ids", list_col(&some(ids), Elem::I32, false)),
                ("loss_mask", list_col(&some(mask), Elem::I32, false)),
            ],
            100,
        );
    }
    std::fs::write(tmp.path().join("notes.txt"), "not data").unwrap();
    let ds = open_dataset(tmp.path()).unwrap();
    let all_ids: Vec<_> = ids0.iter().chain(&ids1).cloned().collect();
    let all_mask: Vec<_> = mask0.iter().chain(&mask1).cloned().collect();
    expect_rows(ds.as_ref(), &all_ids, &all_mask);
}

#[test]
fn single_arrow_file_path() {
    let tmp = tempfile::tempdir().unwrap();
    let f = hf_dir(tmp.path(), 9, Elem::U16, Elem::U8, true, 4);
    let (ids, mask) = rows(9, 0);
    expect_rows(open_dataset(&f).unwrap().as_ref(), &ids, &mask);
    expect_rows(&ArrowDataset::open(&f).unwrap(), &ids, &mask);
}

#[test]
fn empty_stream_has_no_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("x.arrow");
    write_stream(
        &f,
        &[
            ("input_ids", list_col(&[], Elem::I32, false)),
            ("loss_mask", list_col(&[], Elem::I32, false)),
        ],
        10,
    );
    let ds = open_dataset(&f).unwrap();
    assert_eq!(ds.len(), 0);
    assert!(ds.is_empty());
    assert!(ds.get(0).is_err());
}

#[test]
fn extra_columns_are_ignored_and_column_order_is_free() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("x.arrow");
    let (ids, mask) = rows(4, 0);
    write_stream(
        &f,
        &[
            ("loss_mask", list_col(&some(&mask), Elem::I64, false)),
            ("attention_mask", list_col(&some(&mask), Elem::I64, false)),
            ("input_ids", list_col(&some(&ids), Elem::I64, false)),
        ],
        3,
    );
    expect_rows(open_dataset(&f).unwrap().as_ref(), &ids, &mask);
}

//! Bad Arrow content and layouts: missing columns, wrong column types, per-sample problems
//! (negative or too large ids, length mismatch, bad mask values, nulls), and dataset
//! directories that are not one.

use dflash_data::{ArrowDataset, DataError, Dataset, SampleProblem, open_dataset};

use crate::common::*;
use crate::support::err_string;

#[test]
fn missing_column_names_file_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("data-00000-of-00001.arrow");
    let (ids, _) = rows(4, 0);
    write_stream(
        &f,
        &[("input_ids", list_col(&some(&ids), Elem::I32, false))],
        10,
    );
    write_state(tmp.path(), &["data-00000-of-00001.arrow"]);
    let e = ArrowDataset::open(tmp.path()).err().unwrap();
    assert!(
        matches!(
            e,
            DataError::MissingColumn {
                column: "loss_mask",
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("data-00000-of-00001.arrow")
            && msg.contains("\"loss_mask\"")
            && msg.contains("input_ids"),
        "{msg}"
    );
}

#[test]
fn wrong_column_types_are_rejected_with_the_type() {
    type Case<'a> = (&'a str, Vec<(&'a str, arrow_array::ArrayRef)>, &'a str);
    let (ids, mask) = rows(4, 0);
    let cases: Vec<Case> = vec![
        (
            "float mask",
            vec![
                ("input_ids", list_col(&some(&ids), Elem::I32, false)),
                ("loss_mask", list_col(&some(&mask), Elem::F32, false)),
            ],
            "loss_mask",
        ),
        (
            "flat ids",
            vec![
                ("input_ids", flat_i32(4)),
                ("loss_mask", list_col(&some(&mask), Elem::I32, false)),
            ],
            "input_ids",
        ),
        (
            "bool ids",
            vec![
                ("input_ids", list_col(&some(&ids), Elem::Bool, false)),
                ("loss_mask", list_col(&some(&mask), Elem::I32, false)),
            ],
            "input_ids",
        ),
    ];
    for (what, cols, col) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("bad.arrow");
        write_stream(&f, &cols, 10);
        let e = open_dataset(&f).err().unwrap();
        assert!(
            matches!(&e, DataError::ColumnType { column, .. } if *column == col),
            "{what}: {e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("bad.arrow") && msg.contains(col),
            "{what}: {msg}"
        );
    }
}

fn one_file(cols: &[(&str, arrow_array::ArrayRef)]) -> (tempfile::TempDir, ArrowDataset) {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("data.arrow");
    write_stream(&f, cols, 2);
    let ds = ArrowDataset::open(&f).unwrap();
    (tmp, ds)
}

#[test]
fn per_sample_problems_name_sample_column_and_position() {
    let good_ids = vec![vec![1, 2, 3], vec![4, 5], vec![6, 7, 8, 9]];
    let good_mask = vec![vec![0, 1, 1], vec![1, 1], vec![0, 0, 1, 1]];

    // negative id
    let mut ids = good_ids.clone();
    ids[2][3] = -7;
    let (_t, ds) = one_file(&[
        ("input_ids", list_col(&some(&ids), Elem::I16, false)),
        ("loss_mask", list_col(&some(&good_mask), Elem::I8, false)),
    ]);
    assert!(ds.get(0).is_ok() && ds.get(1).is_ok());
    let msg = err_string(ds.get(2));
    assert!(
        msg.contains("data.arrow")
            && msg.contains("sample 2")
            && msg.contains("input_ids[3] = -7 is negative"),
        "{msg}"
    );

    // id too large for u32
    let mut ids = good_ids.clone();
    ids[1][0] = 5_000_000_000;
    let (_t, ds) = one_file(&[
        ("input_ids", list_col(&some(&ids), Elem::I64, false)),
        ("loss_mask", list_col(&some(&good_mask), Elem::I8, false)),
    ]);
    let msg = err_string(ds.get(1));
    assert!(
        msg.contains("sample 1") && msg.contains("does not fit in u32"),
        "{msg}"
    );
    // u64 beyond i64 range
    let (_t, ds) = one_file(&[
        (
            "input_ids",
            list_col(&some(&[vec![-1i64]]), Elem::U64, false),
        ), // -1 as u64 = 2^64-1
        ("loss_mask", list_col(&some(&[vec![1]]), Elem::I8, false)),
    ]);
    assert!(err_string(ds.get(0)).contains("18446744073709551615"));

    // length mismatch
    let mut mask = good_mask.clone();
    mask[0].push(1);
    let (_t, ds) = one_file(&[
        ("input_ids", list_col(&some(&good_ids), Elem::I32, true)),
        ("loss_mask", list_col(&some(&mask), Elem::I32, true)),
    ]);
    let e = ds.get(0).unwrap_err();
    assert!(
        matches!(
            &e,
            DataError::BadSample {
                index: 0,
                problem: SampleProblem::LengthMismatch {
                    ids_len: 3,
                    mask_len: 4
                },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(ds.get(1).is_ok());

    // bad mask value
    let mut mask = good_mask.clone();
    mask[2][1] = 2;
    let (_t, ds) = one_file(&[
        ("input_ids", list_col(&some(&good_ids), Elem::I32, false)),
        ("loss_mask", list_col(&some(&mask), Elem::U8, false)),
    ]);
    assert!(err_string(ds.get(2)).contains("loss_mask[1] = 2, expected 0 or 1"));

    // null list
    let mut ids: Vec<Option<Vec<i64>>> = some(&good_ids);
    ids[1] = None;
    let (_t, ds) = one_file(&[
        ("input_ids", list_col(&ids, Elem::I32, false)),
        ("loss_mask", list_col(&some(&good_mask), Elem::I8, false)),
    ]);
    assert_eq!(ds.seq_len(1), 0);
    let msg = err_string(ds.get(1));
    assert!(
        msg.contains("sample 1") && msg.contains("\"input_ids\" is null"),
        "{msg}"
    );
    assert!(ds.get(2).is_ok());
}

#[test]
fn null_element_inside_a_list() {
    use arrow_array::builder::{Int32Builder, ListBuilder};
    let mut b = ListBuilder::new(Int32Builder::new());
    b.values().append_value(3);
    b.values().append_null();
    b.append(true);
    let ids: arrow_array::ArrayRef = std::sync::Arc::new(b.finish());
    let (_t, ds) = one_file(&[
        ("input_ids", ids),
        ("loss_mask", list_col(&some(&[vec![1, 1]]), Elem::I8, false)),
    ]);
    assert!(err_string(ds.get(0)).contains("input_ids[1] is null"));
}

#[test]
fn layout_errors() {
    // DatasetDict root
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("dataset_dict.json"),
        "{\"splits\": [\"train\", \"eval\"]}",
    )
    .unwrap();
    for s in ["train", "eval"] {
        std::fs::create_dir(tmp.path().join(s)).unwrap();
    }
    let msg = err_string(open_dataset(tmp.path()));
    assert!(
        msg.contains("DatasetDict") && msg.contains("eval, train"),
        "{msg}"
    );

    // state.json naming a missing file
    let tmp = tempfile::tempdir().unwrap();
    write_state(tmp.path(), &["data-00000-of-00001.arrow"]);
    let msg = err_string(open_dataset(tmp.path()));
    assert!(
        msg.contains("state.json") && msg.contains("data-00000-of-00001.arrow"),
        "{msg}"
    );

    // invalid state.json
    std::fs::write(tmp.path().join("state.json"), "{not json").unwrap();
    assert!(err_string(open_dataset(tmp.path())).contains("invalid JSON"));

    // empty directory
    let tmp = tempfile::tempdir().unwrap();
    assert!(err_string(open_dataset(tmp.path())).contains("no state.json and no *.arrow"));

    // missing path / unknown extension / empty file
    assert!(err_string(open_dataset(tmp.path().join("nope.arrow"))).contains("no such file"));
    std::fs::write(tmp.path().join("x.parquet"), "PAR1").unwrap();
    assert!(
        err_string(open_dataset(tmp.path().join("x.parquet"))).contains("unrecognized dataset")
    );
    std::fs::write(tmp.path().join("empty.arrow"), "").unwrap();
    assert!(err_string(open_dataset(tmp.path().join("empty.arrow"))).contains("empty"));
}

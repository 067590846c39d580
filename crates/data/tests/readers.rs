//! Arrow (HF save_to_disk) and JSONL readers on real files written at runtime.

mod common;

use std::path::Path;

use common::*;
use dflash_data::{
    ArrowDataset, DataError, Dataset, JsonlDataset, Sample, SampleProblem, open_dataset,
};

fn expect_rows(ds: &dyn Dataset, ids: &[Vec<i64>], mask: &[Vec<i64>]) {
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

fn err_string<T>(r: Result<T, DataError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

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

/// Opens and reads every sample; must never panic. Returns the first error, if any.
fn open_and_read_all(path: &Path) -> Option<DataError> {
    match ArrowDataset::open(path) {
        Err(e) => Some(e),
        Ok(ds) => {
            let mut first = None;
            for i in 0..ds.len() {
                let _ = ds.seq_len(i);
                if let Err(e) = ds.get(i) {
                    first.get_or_insert(e);
                }
            }
            first
        }
    }
}

#[test]
fn truncated_stream_is_an_error_naming_the_file_at_every_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.arrow");
    write_stream(
        &src,
        &[
            (
                "input_ids",
                list_col(&some(&rows(12, 0).0), Elem::I64, false),
            ),
            (
                "loss_mask",
                list_col(&some(&rows(12, 0).1), Elem::I8, false),
            ),
        ],
        3,
    );
    let bytes = std::fs::read(&src).unwrap();
    assert!(bytes.len() > 500);
    let cut = tmp.path().join("cut.arrow");
    for len in 0..bytes.len() {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let e = ArrowDataset::open(&cut)
            .err()
            .unwrap_or_else(|| panic!("truncated to {len} bytes was accepted"));
        assert!(matches!(e, DataError::CorruptArrow { .. }), "{len}: {e:?}");
        assert!(e.to_string().contains("cut.arrow"), "{len}: {e}");
    }
    // Trailing garbage after the end-of-stream marker is also caught.
    let mut extra = bytes.clone();
    extra.extend_from_slice(&[1, 2, 3]);
    std::fs::write(&cut, &extra).unwrap();
    let e = ArrowDataset::open(&cut).err().unwrap();
    assert!(
        e.to_string().contains("after the end-of-stream marker"),
        "{e}"
    );
    // The untouched file still reads.
    assert_eq!(ArrowDataset::open(&src).unwrap().len(), 12);
}

#[test]
fn flipped_bytes_never_panic_and_errors_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.arrow");
    let (ids, mask) = rows(10, 0);
    write_stream(
        &src,
        &[
            ("input_ids", list_col(&some(&ids), Elem::I32, true)),
            ("loss_mask", list_col(&some(&mask), Elem::U8, true)),
        ],
        4,
    );
    let bytes = std::fs::read(&src).unwrap();
    let bad = tmp.path().join("flipped.arrow");
    let mut errors = 0;
    for pos in 0..bytes.len() {
        for mask_bits in [0xFFu8, 0x01, 0x80] {
            let mut b = bytes.clone();
            b[pos] ^= mask_bits;
            std::fs::write(&bad, &b).unwrap();
            if let Some(e) = open_and_read_all(&bad) {
                errors += 1;
                assert!(e.to_string().contains("flipped.arrow"), "byte {pos}: {e}");
            }
        }
    }
    assert!(
        errors > bytes.len() / 4,
        "only {errors} of {} corruptions detected",
        3 * bytes.len()
    );
}

#[test]
fn ipc_file_format_is_rejected_with_a_hint() {
    use arrow_ipc::writer::FileWriter;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("file-format.arrow");
    let (ids, mask) = rows(3, 0);
    let a = list_col(&some(&ids), Elem::I32, false);
    let m = list_col(&some(&mask), Elem::I32, false);
    let schema = Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("input_ids", a.data_type().clone(), true),
        arrow_schema::Field::new("loss_mask", m.data_type().clone(), true),
    ]));
    let mut w = FileWriter::try_new(std::fs::File::create(&f).unwrap(), &schema).unwrap();
    w.write(&arrow_array::RecordBatch::try_new(schema.clone(), vec![a, m]).unwrap())
        .unwrap();
    w.finish().unwrap();
    let msg = err_string(open_dataset(&f));
    assert!(
        msg.contains("file-format.arrow") && msg.contains("stream"),
        "{msg}"
    );
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

// ---------------------------------------------------------------- JSONL

fn jsonl(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("data.jsonl");
    std::fs::write(&p, text).unwrap();
    (tmp, p)
}

#[test]
fn jsonl_reads_samples_with_optional_mask_and_blank_lines() {
    let (_t, p) = jsonl(
        "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1], \"text\": \"ignored\"}\n\
         \n\
         {\"input_ids\": [7, 8]}\r\n\
         {\"loss_mask\": [1], \"input_ids\": [4294967295]}",
    );
    let ds = open_dataset(&p).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(
        ds.get(0).unwrap(),
        Sample {
            id: 0,
            ids: vec![1, 2, 3],
            loss_mask: vec![0, 1, 1]
        }
    );
    assert_eq!(
        ds.get(1).unwrap(),
        Sample {
            id: 1,
            ids: vec![7, 8],
            loss_mask: vec![1, 1]
        }
    );
    assert_eq!(ds.get(2).unwrap().ids, vec![u32::MAX]);
    assert_eq!(ds.lengths(), vec![3, 2, 1]);
    assert!(ds.get(3).is_err());
    let j = JsonlDataset::open(&p).unwrap();
    assert_eq!(
        (j.line_of(0), j.line_of(1), j.line_of(2)),
        (Some(1), Some(3), Some(4))
    );
}

#[test]
fn jsonl_bad_lines_name_the_line() {
    let good = "{\"input_ids\": [1, 2], \"loss_mask\": [1, 1]}\n";
    let cases = [
        ("{\"input_ids\": [1, 2,", "EOF"),
        ("{\"loss_mask\": [1]}", "missing field `input_ids`"),
        ("{\"input_ids\": [1, -3]}", "input_ids[1] = -3 is negative"),
        ("{\"input_ids\": [1, 2.5]}", "invalid type"),
        ("{\"input_ids\": [1, 5000000000]}", "does not fit in u32"),
        (
            "{\"input_ids\": [1, 2], \"loss_mask\": [1]}",
            "input_ids has 2 tokens but loss_mask has 1",
        ),
        (
            "{\"input_ids\": [1, 2], \"loss_mask\": [1, 3]}",
            "loss_mask[1] = 3",
        ),
        ("[1, 2, 3]", "invalid type"),
    ];
    for (bad, what) in cases {
        let (_t, p) = jsonl(&format!("{good}{good}{bad}\n{good}"));
        let msg = err_string(JsonlDataset::open(&p));
        assert!(
            msg.contains("data.jsonl:3:") && msg.contains(what),
            "{bad}: {msg}"
        );
    }
    let (_t, p) = jsonl("{\"input_ids\": [1]}\n\u{0}\u{ff}");
    assert!(err_string(open_dataset(&p)).contains("data.jsonl:2:"));
}

/// A UTF-8 byte order mark before the first line (as Windows editors write) is not a JSON
/// error at column 1: the file reads as without it, line numbers unchanged.
#[test]
fn jsonl_with_a_byte_order_mark_reads_as_without_it() {
    let body = "{\"input_ids\": [5, 6], \"loss_mask\": [0, 1]}\n{\"input_ids\": [7]}\n";
    let (_t, p) = jsonl(&format!("\u{feff}{body}"));
    let ds = open_dataset(&p).unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds.get(0).unwrap().ids, vec![5, 6]);
    assert_eq!(ds.get(0).unwrap().loss_mask, vec![0, 1]);
    let j = JsonlDataset::open(&p).unwrap();
    assert_eq!((j.line_of(0), j.line_of(1)), (Some(1), Some(2)));
    // A mark anywhere else is still an error naming its line.
    let (_t, p) = jsonl(&format!("{body}\u{feff}{{\"input_ids\": [1]}}\n"));
    assert!(err_string(JsonlDataset::open(&p)).contains("data.jsonl:3:"));
}

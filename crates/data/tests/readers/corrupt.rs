//! Corrupt Arrow files: truncated at every offset, flipped bytes and the IPC file format are
//! errors naming the file, never a panic.

use std::path::Path;

use dflash_data::{ArrowDataset, DataError, Dataset, open_dataset};

use crate::common::*;
use crate::support::err_string;

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

//! The JSONL reader: masks (required), blank lines, a byte order mark, and bad lines named by
//! their line number.

use dflash_data::{JsonlDataset, Sample, open_dataset};

use crate::support::err_string;

fn jsonl(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("data.jsonl");
    std::fs::write(&p, text).unwrap();
    (tmp, p)
}

#[test]
fn jsonl_reads_samples_masks_and_blank_lines() {
    let (_t, p) = jsonl(
        "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1], \"text\": \"ignored\"}\n\
         \n\
         {\"input_ids\": [7, 8], \"loss_mask\": [1, 0]}\r\n\
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
            loss_mask: vec![1, 0]
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
        (
            "{\"input_ids\": [1, -3], \"loss_mask\": [1, 1]}",
            "input_ids[1] = -3 is negative",
        ),
        (
            "{\"input_ids\": [1, 2.5], \"loss_mask\": [1, 1]}",
            "invalid type",
        ),
        (
            "{\"input_ids\": [1, 5000000000], \"loss_mask\": [1, 1]}",
            "does not fit in u32",
        ),
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
    let (_t, p) = jsonl("{\"input_ids\": [1], \"loss_mask\": [1]}\n\u{0}\u{ff}");
    assert!(err_string(open_dataset(&p)).contains("data.jsonl:2:"));
}

/// A UTF-8 byte order mark before the first line (as Windows editors write) is not a JSON
/// error at column 1: the file reads as without it, line numbers unchanged.
#[test]
fn jsonl_with_a_byte_order_mark_reads_as_without_it() {
    let body = "{\"input_ids\": [5, 6], \"loss_mask\": [0, 1]}\n{\"input_ids\": [7], \"loss_mask\": [1]}\n";
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

/// A line without a usable `loss_mask` fails the open naming `path:line` and the field, as the
/// Arrow reader refuses a dataset without the column: training on an all-ones mask would
/// silently train on the system and user tokens. SFT `labels` get the conversion spelt out; a
/// misspelt key shows among the keys present.
#[test]
fn jsonl_without_a_usable_loss_mask_is_an_error_naming_the_line() {
    let good = "{\"input_ids\": [1, 2], \"loss_mask\": [0, 1]}\n";
    let cases: [(&str, &[&str]); 5] = [
        (
            "{\"input_ids\": [1, 2]}",
            &["missing loss_mask", "dflash prepare"],
        ),
        (
            "{\"input_ids\": [1, 2], \"loss_mask\": null}",
            &["loss_mask is null"],
        ),
        (
            "{\"input_ids\": [1, 2], \"loss-mask\": [0, 1]}",
            &["missing loss_mask", "loss-mask"],
        ),
        (
            "{\"input_ids\": [1, 2], \"labels\": [-100, 2]}",
            &[
                "missing loss_mask",
                "\"labels\" is not read",
                "labels[i] != -100",
                "dflash prepare",
            ],
        ),
        (
            "{\"input_ids\": [1, 2], \"loss_mask\": null, \"labels\": [-100, 2]}",
            &["loss_mask is null", "labels[i] != -100"],
        ),
    ];
    for (bad, what) in cases {
        let (_t, p) = jsonl(&format!("{good}\n{bad}\n{good}"));
        let msg = err_string(open_dataset(&p));
        assert!(msg.contains("data.jsonl:3: "), "{bad}: {msg}");
        for w in what {
            assert!(msg.contains(w), "{bad}: no {w:?} in {msg}");
        }
    }
    // A mask beside `labels` is read and the labels ignored.
    let (_t, p) = jsonl("{\"input_ids\": [1, 2], \"labels\": [-100, 2], \"loss_mask\": [0, 1]}");
    assert_eq!(
        open_dataset(&p).unwrap().get(0).unwrap().loss_mask,
        vec![0, 1]
    );
}

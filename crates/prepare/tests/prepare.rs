//! `prepare` end to end on the Qwen3 fixture target: every input format gives the same
//! output, skipped samples are counted with index and reason, the output is what
//! `dflash_data::open_dataset` reads, and bad inputs are errors naming the file.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema};
use dflash_prepare::{
    DatasetWriter, Input, PrepareError, PrepareOptions, Prepared, Preparer, SkipReason, prepare,
};
use serde_json::{Value, json};

fn target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/qwen3")
}

fn fixture_jsonl() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/conversations.jsonl")
}

fn opts(data: &Path, out: &Path) -> PrepareOptions {
    PrepareOptions {
        target: target(),
        chat_template: None,
        data: data.to_path_buf(),
        out: out.to_path_buf(),
        bucket_bounds: vec![32, 48],
        progress: false,
    }
}

/// The fixture conversations as `messages` lists (ShareGPT rows converted, system first).
fn fixture_messages() -> Vec<Vec<(String, String)>> {
    let text = std::fs::read_to_string(fixture_jsonl()).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            dflash_prepare::parse_sample(&v)
                .unwrap()
                .into_iter()
                .map(|m| (m.role.as_str().to_string(), m.content))
                .collect()
        })
        .collect()
}

fn read_back(dir: &Path) -> Vec<(Vec<u32>, Vec<u8>)> {
    let ds = dflash_data::open_dataset(dir).unwrap();
    (0..ds.len())
        .map(|i| {
            let s = ds.get(i).unwrap();
            (s.ids, s.loss_mask)
        })
        .collect()
}

fn messages_column(convs: &[Vec<(String, String)>]) -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("content", DataType::Utf8, true),
        Field::new("role", DataType::Utf8, true),
    ]);
    let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
    for conv in convs {
        for (role, content) in conv {
            let s = b.values();
            s.field_builder::<StringBuilder>(0)
                .unwrap()
                .append_value(content);
            s.field_builder::<StringBuilder>(1)
                .unwrap()
                .append_value(role);
            s.append(true);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

fn batch(convs: &[Vec<(String, String)>]) -> RecordBatch {
    let messages = messages_column(convs);
    let other: ArrayRef = Arc::new(StringArray::from(vec!["x"; convs.len()]));
    let schema = Arc::new(Schema::new(vec![
        Field::new("source", DataType::Utf8, true),
        Field::new("messages", messages.data_type().clone(), true),
    ]));
    RecordBatch::try_new(schema, vec![other, messages]).unwrap()
}

#[test]
fn jsonl_parquet_and_save_to_disk_inputs_give_the_same_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let convs = fixture_messages();

    let from_jsonl = tmp.path().join("a");
    let s = prepare(&opts(&fixture_jsonl(), &from_jsonl)).unwrap();
    // Sample 5's first turn has reasoning Qwen3 drops from the whole conversation: one extra
    // sample ends with that turn.
    assert_eq!((s.samples, s.written, s.skipped.len()), (7, 8, 0));
    assert_eq!((s.reasoning_samples, s.reasoning_dropped), (1, 0));
    let want = read_back(&from_jsonl);
    assert_eq!(want.len(), 8);
    assert_eq!(s.tokens, want.iter().map(|r| r.0.len() as u64).sum::<u64>());
    assert_eq!(
        s.supervised,
        want.iter()
            .map(|r| r.1.iter().map(|&m| m as u64).sum::<u64>())
            .sum::<u64>()
    );
    // Histogram over the buckets <=32, <=48, >48; sums to the samples written.
    assert_eq!(s.histogram.iter().map(|h| h.1).sum::<usize>(), 8);
    let lens: Vec<usize> = want.iter().map(|r| r.0.len()).collect();
    assert_eq!(s.histogram[0].1, lens.iter().filter(|&&n| n <= 32).count());
    assert_eq!(s.histogram[2].1, lens.iter().filter(|&&n| n > 48).count());
    let summary = s.to_string();
    assert!(
        summary.contains("samples: 7 read, 8 written, 0 skipped\nreasoning: 1 extra samples"),
        "{summary}"
    );

    // Parquet, in two row groups.
    let pq = tmp.path().join("chat.parquet");
    let b = batch(&convs);
    let mut w =
        parquet::arrow::ArrowWriter::try_new(File::create(&pq).unwrap(), b.schema(), None).unwrap();
    w.write(&b.slice(0, 3)).unwrap();
    w.flush().unwrap();
    w.write(&b.slice(3, 4)).unwrap();
    w.close().unwrap();
    let from_parquet = tmp.path().join("b");
    prepare(&opts(&pq, &from_parquet)).unwrap();
    assert_eq!(read_back(&from_parquet), want);

    // A save_to_disk directory of chat rows (two stream files listed by state.json).
    let hf = tmp.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    for (k, (lo, n)) in [(0usize, 4usize), (4, 3)].into_iter().enumerate() {
        let part = b.slice(lo, n);
        let f = File::create(hf.join(format!("data-0000{k}-of-00002.arrow"))).unwrap();
        let mut sw = arrow_ipc::writer::StreamWriter::try_new(f, &part.schema()).unwrap();
        sw.write(&part).unwrap();
        sw.finish().unwrap();
    }
    std::fs::write(
        hf.join("state.json"),
        json!({"_data_files": [{"filename": "data-00000-of-00002.arrow"},
                               {"filename": "data-00001-of-00002.arrow"}]})
        .to_string(),
    )
    .unwrap();
    // A .json array (ShareGPT exports), with a byte order mark.
    let arr = tmp.path().join("chat.json");
    let text = std::fs::read_to_string(fixture_jsonl()).unwrap();
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    std::fs::write(
        &arr,
        format!("\u{feff}{}", serde_json::to_string_pretty(&rows).unwrap()),
    )
    .unwrap();
    let from_array = tmp.path().join("d");
    prepare(&opts(&arr, &from_array)).unwrap();
    assert_eq!(read_back(&from_array), want);

    let from_hf = tmp.path().join("c");
    prepare(&opts(&hf, &from_hf)).unwrap();
    assert_eq!(read_back(&from_hf), want);

    // The output is deterministic: same data files, same fingerprint.
    let state = |d: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("state.json")).unwrap()).unwrap()
    };
    assert_eq!(
        state(&from_jsonl)["_fingerprint"],
        state(&from_hf)["_fingerprint"]
    );
    let info: Value = serde_json::from_str(
        &std::fs::read_to_string(from_jsonl.join("dataset_info.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(info["features"]["input_ids"]["feature"]["dtype"], "int32");
}

#[test]
fn skipped_samples_are_counted_with_index_and_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("mixed.jsonl");
    let good = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The capital of France is Paris."}]});
    let lines = [
        good.clone(),
        json!({"messages": [{"role": "wizard", "content": "x"}]}),
        json!({"text": "no conversation"}),
        json!({"messages": [{"role": "user", "content": "only a question"}]}),
        json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}),
        json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a\u{FDD0}"}]}),
        good,
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n\n")).collect();
    std::fs::write(&data, text).unwrap();
    let out = tmp.path().join("out");
    let s = prepare(&opts(&data, &out)).unwrap();
    assert_eq!((s.samples, s.written), (7, 2));
    let got: Vec<(u64, &'static str)> = s.skipped.iter().map(|(i, r)| (*i, r.kind())).collect();
    assert_eq!(
        got,
        [
            (1, "malformed roles or content"),
            (2, "no conversation"),
            (3, "no assistant turn"),
            (4, "mask all zeros"),
            (5, "content holds a private marker"),
        ]
    );
    assert_eq!(read_back(&out).len(), 2);
    let summary = s.to_string();
    assert!(
        summary.contains("sample 1: message 0: unknown role \"wizard\""),
        "{summary}"
    );
}

#[test]
fn all_skipped_empty_and_unreadable_inputs_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": 1}\n{\"messages\": []}\n").unwrap();
    let out = tmp.path().join("out");
    match prepare(&opts(&bad, &out)) {
        Err(PrepareError::AllSkipped { total, first, .. }) => {
            assert_eq!(total, 2);
            assert_eq!(first[0], (0, SkipReason::NoConversation));
        }
        other => panic!("{other:?}"),
    }
    assert!(!out.exists(), "nothing is left behind");
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !leftovers.iter().any(|n| n.contains(".tmp-")),
        "{leftovers:?}"
    );

    let empty = tmp.path().join("empty.jsonl");
    std::fs::write(&empty, "\u{feff}\n\n").unwrap();
    assert!(matches!(
        prepare(&opts(&empty, &out)),
        Err(PrepareError::Empty { .. })
    ));

    let broken = tmp.path().join("broken.jsonl");
    std::fs::write(&broken, "{\"messages\": []}\n{not json\n").unwrap();
    let e = prepare(&opts(&broken, &out)).unwrap_err().to_string();
    assert!(e.contains("broken.jsonl:2:"), "{e}");

    let pq = tmp.path().join("nochat.parquet");
    let col: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
    let b = RecordBatch::try_from_iter([("text", col)]).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(File::create(&pq).unwrap(), b.schema(), None).unwrap();
    w.write(&b).unwrap();
    w.close().unwrap();
    let e = prepare(&opts(&pq, &out)).unwrap_err().to_string();
    assert!(
        e.contains("nochat.parquet") && e.contains("columns present: [text]"),
        "{e}"
    );

    let e = prepare(&opts(&tmp.path().join("data.csv"), &out)).unwrap_err();
    assert!(e.to_string().contains("no such file"), "{e}");

    let mut o = opts(&fixture_jsonl(), &out);
    o.target = tmp.path().to_path_buf();
    let e = prepare(&o).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
}

#[test]
fn output_shards_and_batches_are_read_back_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sharded");
    // Tiny shards: a new shard after every record batch of 1000 rows.
    let mut w = DatasetWriter::with_shard_bytes(&out, 1).unwrap();
    let rows: Vec<Prepared> = (0..2500u32)
        .map(|i| Prepared {
            ids: (0..1 + i % 5).map(|k| i * 7 + k).collect(),
            loss_mask: (0..1 + i % 5).map(|k| (k % 2) as u8).collect(),
        })
        .collect();
    for (i, r) in rows.iter().enumerate() {
        w.push(i as u64, r).unwrap();
    }
    let files = w.finish().unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "data-00000-of-00003.arrow",
            "data-00001-of-00003.arrow",
            "data-00002-of-00003.arrow"
        ]
    );
    let back = read_back(&out);
    assert_eq!(back.len(), 2500);
    for (r, (ids, mask)) in rows.iter().zip(&back) {
        assert_eq!((&r.ids, &r.loss_mask), (ids, mask));
    }
    let mut w = DatasetWriter::create(&tmp.path().join("big")).unwrap();
    let e = w
        .push(
            9,
            &Prepared {
                ids: vec![u32::MAX],
                loss_mask: vec![1],
            },
        )
        .unwrap_err();
    assert!(
        matches!(e, PrepareError::TokenRange { index: 9, .. }),
        "{e}"
    );
}

#[test]
fn the_input_reader_streams_rows_in_order() {
    let input = Input::open(&fixture_jsonl()).unwrap();
    assert_eq!(input.rows_hint(), Some(7));
    let mut seen = Vec::new();
    input
        .for_each_chunk(2, &mut |rows| {
            assert!(rows.len() <= 2);
            seen.extend(rows.into_iter().map(|r| r.0));
            Ok(())
        })
        .unwrap();
    assert_eq!(seen, (0..7).collect::<Vec<u64>>());
    let _ = Preparer::from_target_dir(&target(), None).unwrap();
}

fn small_rows() -> Vec<Prepared> {
    (0..5u32)
        .map(|i| Prepared {
            ids: vec![i, i + 1, i + 2],
            loss_mask: vec![0, 1, 1],
        })
        .collect()
}

fn write_rows(w: &mut DatasetWriter, rows: &[Prepared]) {
    for (i, r) in rows.iter().enumerate() {
        w.push(i as u64, r).unwrap();
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn an_existing_empty_output_directory_is_filled_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("mnt");
    std::fs::create_dir(&out).unwrap();
    let rows = small_rows();
    let mut w = DatasetWriter::create(&out).unwrap();
    write_rows(&mut w, &rows);
    let files = w.finish().unwrap();
    assert_eq!(files, [out.join("data-00000-of-00001.arrow")]);
    assert_eq!(
        names_in(&out),
        [
            "data-00000-of-00001.arrow",
            "dataset_info.json",
            "state.json"
        ]
    );
    assert_eq!(names_in(tmp.path()), ["mnt"]);
    let back = read_back(&out);
    assert_eq!(back.len(), rows.len());
    assert_eq!((&back[4].0, &back[4].1), (&rows[4].ids, &rows[4].loss_mask));
}

/// The directory an `Output` error names, which must hold the whole finished dataset.
fn kept_dataset(e: PrepareError, out: &Path, rows: &[Prepared]) -> PathBuf {
    let msg = e.to_string();
    let PrepareError::Output { path, .. } = e else {
        panic!("{msg}")
    };
    assert!(
        msg.contains("the finished dataset is kept here") && msg.contains(&*out.to_string_lossy()),
        "{msg}"
    );
    assert_eq!(read_back(&path).len(), rows.len(), "{msg}");
    path
}

#[test]
fn a_finished_dataset_is_kept_when_the_final_move_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = small_rows();

    // A new output, taken by a file while the dataset was written: the rename fails.
    let out = tmp.path().join("new");
    let mut w = DatasetWriter::create(&out).unwrap();
    write_rows(&mut w, &rows);
    std::fs::write(&out, "someone else's").unwrap();
    let kept = kept_dataset(w.finish().unwrap_err(), &out, &rows);
    assert_eq!(kept.parent(), Some(tmp.path()));

    // An existing empty directory (a mount point cannot be removed), where a file of the
    // dataset's name appeared meanwhile: nothing is moved, nothing is lost.
    let out = tmp.path().join("mnt");
    std::fs::create_dir(&out).unwrap();
    let mut w = DatasetWriter::create(&out).unwrap();
    write_rows(&mut w, &rows);
    std::fs::create_dir_all(out.join("state.json/x")).unwrap();
    let kept = kept_dataset(w.finish().unwrap_err(), &out, &rows);
    assert_eq!(kept.parent(), Some(out.as_path()));

    // An unfinished one is removed.
    let out = tmp.path().join("dropped");
    let mut w = DatasetWriter::create(&out).unwrap();
    write_rows(&mut w, &rows);
    drop(w);
    assert!(
        !names_in(tmp.path()).iter().any(|n| n.contains("dropped")),
        "{:?}",
        names_in(tmp.path())
    );
}

fn write_parquet(path: &Path, b: &RecordBatch) {
    let mut w = parquet::arrow::ArrowWriter::try_new(File::create(path).unwrap(), b.schema(), None)
        .unwrap();
    w.write(b).unwrap();
    w.close().unwrap();
}

#[test]
fn a_hub_folder_of_several_splits_is_refused_and_a_pattern_picks_one() {
    let tmp = tempfile::tempdir().unwrap();
    let b = batch(&fixture_messages());
    // ultrachat_200k's layout: every split side by side in data/.
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let train = [
        data.join("train_sft-00000-of-00002.parquet"),
        data.join("train_sft-00001-of-00002.parquet"),
    ];
    write_parquet(&train[0], &b.slice(0, 4));
    write_parquet(&train[1], &b.slice(4, 3));
    write_parquet(
        &data.join("test_sft-00000-of-00001.parquet"),
        &b.slice(0, 2),
    );
    write_parquet(
        &data.join("train_gen-00000-of-00001.parquet"),
        &b.slice(2, 2),
    );

    let out = tmp.path().join("out");
    let e = prepare(&opts(&data, &out)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, PrepareError::Input { .. }), "{msg}");
    assert!(
        msg.contains("3 splits: test_sft (1 file), train_gen (1 file), train_sft (2 files)"),
        "{msg}"
    );
    assert!(msg.contains("-*.parquet'"), "{msg}");
    assert!(!out.exists());

    let s = prepare(&opts(&data.join("train_sft-*.parquet"), &out)).unwrap();
    assert_eq!(s.inputs, train);
    assert_eq!((s.samples, s.written), (7, 8));
    assert!(
        s.to_string()
            .contains(&format!("input: {}\n", train[1].display())),
        "{s}"
    );

    // One split in a folder (and files that name no split) is read whole.
    std::fs::remove_file(data.join("test_sft-00000-of-00001.parquet")).unwrap();
    std::fs::remove_file(data.join("train_gen-00000-of-00001.parquet")).unwrap();
    write_parquet(&data.join("extra.parquet"), &b.slice(0, 1));
    let input = Input::open(&data).unwrap();
    assert_eq!(
        input.files(),
        [
            data.join("extra.parquet"),
            train[0].clone(),
            train[1].clone()
        ]
    );
    assert_eq!(input.rows_hint(), Some(8));

    for (pattern, needle) in [
        ("nothing-*.parquet", "no file matches"),
        ("*", "not all .parquet or all .arrow"),
    ] {
        std::fs::write(data.join("notes.txt"), "x").unwrap();
        let e = Input::open(&data.join(pattern)).err().unwrap().to_string();
        assert!(e.contains(needle), "{pattern}: {e}");
    }
    assert_eq!(
        Input::open(&fixture_jsonl()).unwrap().files(),
        [fixture_jsonl()]
    );
}

#[test]
fn a_folder_of_one_split_or_of_no_split_names_is_read_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let b = batch(&fixture_messages());
    let folder = |names: &[&str]| {
        let dir = tmp.path().join(names.join("+"));
        std::fs::create_dir(&dir).unwrap();
        for (k, n) in names.iter().enumerate() {
            write_parquet(&dir.join(n), &b.slice(k, 1));
        }
        dir
    };
    for names in [
        &["train_0.parquet", "train_1.parquet"][..],
        &["train.0.parquet", "train.1.parquet"],
        &["train_part1.parquet", "train_part2.parquet"],
        &["training.parquet", "train-00000-of-00001.parquet"],
        &["2023-12-31.parquet", "2024-01-01.parquet"],
        &["part-0.parquet", "part-1.parquet", "test_notes.parquet"],
    ] {
        let input = Input::open(&folder(names)).unwrap_or_else(|e| panic!("{names:?}: {e}"));
        assert_eq!(input.files().len(), names.len(), "{names:?}");
        // One row a file: file k's first row is sample k.
        let starts = input.for_each_chunk_by_file(4, &mut |_| Ok(())).unwrap();
        assert_eq!(
            starts,
            (0..names.len() as u64).collect::<Vec<_>>(),
            "{names:?}"
        );
    }
    // Split keywords name the standard splits, which are not read together.
    let dir = folder(&["train_0.parquet", "train_1.parquet", "dev_0.parquet"]);
    let msg = Input::open(&dir).err().unwrap().to_string();
    assert!(
        msg.contains("2 splits: train (2 files), validation (1 file)") && msg.contains("train_*"),
        "{msg}"
    );
}

/// A torn last line fails `prepare` when the input is opened, naming `path:line`, before any
/// sample is prepared or the output is looked at (here an output `prepare` would refuse: the
/// line's error comes first).
#[test]
fn a_torn_last_jsonl_line_fails_before_any_sample_is_prepared() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("chat.jsonl");
    // More lines than one chunk of rows handed to the workers.
    let good = std::fs::read_to_string(fixture_jsonl()).unwrap().repeat(50);
    let lines = good.lines().count();
    std::fs::write(
        &data,
        format!("{good}{{\"messages\": [{{\"role\": \"user\", \"content\": \"cut he"),
    )
    .unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "x").unwrap();
    let e = prepare(&opts(&data, &out)).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, PrepareError::BadLine { line, .. } if line == lines + 1),
        "{msg}"
    );
    assert!(
        msg.starts_with(&format!("{}:{}: ", data.display(), lines + 1)),
        "{msg}"
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("keep.txt")]);
}

//! What the job shares with the rest of the workspace: evaluation stops a sequence at the
//! ids `dflash regenerate` ends a turn at, and training decays the loss with the gamma that
//! the config reports.

use std::path::Path;

use dflash_pipeline::job::JobPlan;
use dflash_pipeline::train;

use crate::support::{Fixture, TARGET, link, tiny_samples};

/// A copy of the tiny target shaped like a base checkpoint (Qwen3-*-Base): `config.json`
/// ends at `<|endoftext|>` (257), while its chat turns end with `<|im_end|>` (259), which only
/// `tokenizer_config.json` names.
fn base_like_target(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(Path::new(TARGET).join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>"}"#,
    )
    .unwrap();
}

/// One conversation of two turns: `(ids, loss_mask, length of the first answer with its
/// <|im_end|>, position of that answer's first token)`.
fn two_turns() -> (Vec<u32>, Vec<u8>, usize, usize) {
    const IM_START: u32 = 258;
    const IM_END: u32 = 259;
    let text = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
    let prompt = [
        vec![IM_START],
        text("u\nhi"),
        vec![IM_END, 10, IM_START],
        text("a\n"),
    ];
    let answer = [text("hello"), vec![IM_END]].concat();
    let next_turn = [
        vec![10, IM_START],
        text("u\nok"),
        vec![IM_END, 10, IM_START],
        text("a\n"),
    ];
    let next_answer = [text("more words"), vec![IM_END]].concat();
    let (prompt, next_turn) = (prompt.concat(), next_turn.concat());
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for (part, m) in [
        (&prompt, 0),
        (&answer, 1),
        (&next_turn, 0),
        (&next_answer, 1),
    ] {
        ids.extend(part);
        mask.extend(std::iter::repeat_n(m, part.len()));
    }
    (ids, mask, answer.len(), prompt.len())
}

/// Tokens a one-sequence evaluation committed over all its cycles.
fn committed(report: &dflash_training::TauReport) -> usize {
    assert_eq!(report.sequences, 1);
    (report.tau * report.cycles as f64).round() as usize
}

/// Evaluation of a base-like target stops at the first `<|im_end|>`, where regeneration
/// ends the turn, not at the end of the next user turn and answer (which it did when it read
/// only `config.json`'s `eos_token_id`, lowering tau).
#[test]
fn evaluation_stops_at_the_tokenizer_configs_eos_token() {
    link();
    let fx = Fixture::new(&tiny_samples(6));
    let mut cfg = fx.config(&[("train.max_steps", "1")]);
    let out = train(&cfg, None).unwrap();

    let (ids, mask, answer, p0) = two_turns();
    let data = fx.path().join("two_turns.jsonl");
    let line = serde_json::json!({ "input_ids": ids, "loss_mask": mask });
    std::fs::write(&data, format!("{line}\n")).unwrap();

    // The tiny target as shipped ends answers only at 257, which this sample lacks: drafted
    // to its end.
    let whole = dflash_pipeline::evaluate(&cfg, &out.run_dir, &data).unwrap();
    assert_eq!(committed(&whole.report), ids.len() - 1 - p0);

    let base = fx.path().join("base-target");
    base_like_target(&base);
    cfg.target.path = Some(base);
    let stopped = dflash_pipeline::evaluate(&cfg, &out.run_dir, &data).unwrap();
    // Drafting starts after the answer's first token and commits up to its <|im_end|>.
    assert_eq!(committed(&stopped.report), answer - 1);
}

/// The block spec training draws with decays by `TrainConfig::gamma`, the value the config
/// reports (training once used a curve of its own, which differed off block sizes 8, 10, 16).
#[test]
fn training_uses_the_configs_gamma() {
    let fx = Fixture::new(&tiny_samples(6));
    for bs in [2, 4, 8, 10, 12, 16, 20] {
        let cfg = fx.config(&[("drafter.block_size", &bs.to_string())]);
        let plan = JobPlan::new(&cfg).unwrap();
        assert_eq!(plan.spec.gamma, cfg.gamma(bs) as f32, "block {bs}");
        assert_eq!(
            plan.spec.gamma,
            dflash_config::default_gamma(bs) as f32,
            "block {bs}"
        );
    }
}

//! The plan's refusals and its place in the job (the measured-peak comparison is
//! `tests/memory_plan.rs`, in a binary of its own).

use std::path::Path;
use std::sync::Arc;

use dflash_config::TrainConfig;
use dflash_core::Backend;
use dflash_core::registry::{BackendOptions, create_backend};

use super::*;
use crate::error::cause_chain;
use crate::job::JobPlan;

const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");
const TINY_TRAIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-data/train");

fn config(runs: &Path, overrides: &[(&str, &str)]) -> TrainConfig {
    let text = format!(
        r#"
[target]
path = {TARGET:?}
[drafter]
num_layers = 2
block_size = 4
num_target_features = 2
[data]
train = {TINY_TRAIN:?}
max_len = 256
bucket_bounds = [256]
token_budget = 512
num_anchors = 8
[train]
epochs = 1
max_steps = 2
seed = 7
[backend]
name = "reference"
attention = "reference"
[pipeline]
queue_capacity = 2
[run]
dir = {runs:?}
name = "run"
"#
    );
    let ov: Vec<(String, String)> = overrides
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    TrainConfig::load_toml_str(&text, "test", Path::new("/"), &ov).unwrap()
}

fn reference() -> Arc<dyn Backend> {
    dflash_backend_reference::link();
    let opts = BackendOptions {
        attention: "reference".into(),
        threads: 1,
        device: 0,
    };
    create_backend("reference", &opts).unwrap()
}

#[test]
fn a_job_that_does_not_fit_is_refused_naming_each_knob_with_the_peak_it_would_give() {
    let runs = tempfile::tempdir().unwrap();
    // Eight steps of one micro-batch each: more than the queues hold, so their capacity counts.
    let plan = JobPlan::new(&config(runs.path(), &[("train.max_steps", "8")])).unwrap();
    let b = [reference()];
    let mut mp = MemoryPlan::new(&plan, &b, &b);
    assert_eq!(mp.devices.len(), 1, "one host device: {mp:?}");
    let d = &mut mp.devices[0];
    assert_eq!((d.target_workers, d.drafter_replicas), (1, 1));
    let sum: u64 = d.terms.iter().map(|t| t.bytes).sum();
    assert_eq!(sum, d.peak_bytes, "the terms add up to the peak");
    for term in [
        "drafter weights",
        "gradients",
        "AdamW moments",
        "frozen embedding + LM head",
        "target weights",
        "target forward",
        "features in flight",
        "drafter activations kept",
        "drafter step working set",
    ] {
        assert!(
            d.terms.iter().any(|t| t.name == term),
            "{term} missing: {d:?}"
        );
    }
    // The reference backend reports no device memory: the plan is checked against the host's
    // and says so.
    assert!(mp.devices[0].host_memory);
    let table = mp.table();
    if mp.devices[0].free_bytes.is_some() {
        assert!(table.contains(" total, host memory)"), "{table}");
    }
    // The tiny drafter's state is written in place because it is small, not for want of room.
    assert!(!mp.snapshot_wanted && !mp.background_checkpoints);
    assert!(
        table.contains("checkpoints in place (a small state)"),
        "{table}"
    );
    // The host has room for the tiny job; half its peak does not.
    mp.check(&plan, &b, &b).unwrap();
    let peak = mp.devices[0].peak_bytes;
    mp.devices[0].free_bytes = Some(peak / 2);
    mp.devices[0].total_bytes = Some(peak);
    let e = mp.check(&plan, &b, &b).unwrap_err();
    let PipelineError::PlanDoesNotFit { advice, .. } = &e else {
        panic!("{e:?}");
    };
    let msg = cause_chain(&e);
    assert!(msg.contains("does not fit in the memory of cpu"), "{msg}");
    // Each knob with the peak it would give, every one of them smaller than the job's.
    for knob in [
        "train.recompute = true",
        "data.token_budget = 256",
        "data.num_anchors = 4",
        "pipeline.queue_capacity = 1",
    ] {
        let at = advice
            .find(knob)
            .unwrap_or_else(|| panic!("{knob} missing: {msg}"));
        let mut words = advice[at + knob.len()..]
            .trim_start_matches(" (")
            .split(' ');
        let (value, unit) = (words.next().unwrap(), words.next().unwrap());
        let scale = match unit.trim_end_matches([')', ',']) {
            "GiB" => 1u64 << 30,
            "MiB" => 1 << 20,
            "KiB" => 1 << 10,
            other => panic!("unit {other}: {msg}"),
        };
        let with = value.parse::<f64>().unwrap() * scale as f64;
        assert!(with < peak as f64, "{knob}: {with} B vs {peak} B: {msg}");
    }
}

#[test]
fn a_job_too_big_for_this_machine_is_refused_by_train_before_it_allocates() {
    // A 44M-wide MLP on the tiny target's hidden size 128: ~500 GiB of drafter state, within
    // the config's 1 TiB bound, so only the plan stands between it and the allocator.
    if host_capacity().is_some_and(|c| c.free > 600 << 30) {
        eprintln!("skipped: this host has more than 600 GiB free");
        return;
    }
    let runs = tempfile::tempdir().unwrap();
    let cfg = config(runs.path(), &[("drafter.intermediate_size", "44000000")]);
    let t0 = std::time::Instant::now();
    let e = match crate::job::train(&cfg, None) {
        Err(e) => e,
        Ok(_) => panic!("a 500 GiB drafter trained"),
    };
    assert!(matches!(e, PipelineError::PlanDoesNotFit { .. }), "{e:?}");
    let msg = cause_chain(&e);
    for needle in [
        "does not fit in the memory of cpu",
        "GiB are free",
        "data.num_anchors =",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    let run = runs.path().join("run");
    assert!(run.join(MEMORY_PLAN_FILE).exists());
    let written = std::fs::read_to_string(run.join("error.txt")).unwrap();
    assert!(written.contains("does not fit"), "{written}");
    // Refused from the shapes: no weight was drawn (that alone would take minutes).
    assert!(t0.elapsed().as_secs() < 30, "{:?}", t0.elapsed());
}

#[test]
fn absurd_drafter_sizes_are_refused_before_anything_is_allocated() {
    let runs = tempfile::tempdir().unwrap();
    for (knob, value, field) in [
        (
            "drafter.intermediate_size",
            "100000000000",
            "intermediate_size",
        ),
        ("drafter.head_dim", "1000000000", "head_dim"),
        ("drafter.num_layers", "100000000", "num_hidden_layers"),
    ] {
        let cfg = config(runs.path(), &[(knob, value)]);
        let e = match crate::job::train(&cfg, None) {
            Err(e) => e,
            Ok(_) => panic!("{knob}={value} trained"),
        };
        let msg = cause_chain(&e);
        assert!(
            msg.contains(field) && msg.contains(value),
            "{knob}={value}: {msg}"
        );
        // Refused while planning: the run directory holds no weights.
        assert!(!runs.path().join("run/model.safetensors").exists());
    }
    // The plan alone, given such a drafter anyway (no config check in the way): priced in
    // constant time, far beyond any device, and refused by `check`.
    let plan = JobPlan::new(&config(runs.path(), &[])).unwrap();
    let mut d = plan.drafter.clone();
    d.intermediate_size = 100_000_000_000;
    d.num_hidden_layers = 100_000_000;
    let mb = MicroShape {
        ctx_rows: 64,
        blocks: 8,
    };
    let p = DrafterPlan::new(&d, mb, 1, false, &BackendModel::reference());
    assert!(p.peak > 1 << 50, "{p:?}");
}

#[test]
fn a_run_prints_and_writes_its_plan() {
    let runs = tempfile::tempdir().unwrap();
    let eval = format!("{TINY_TRAIN:?}");
    let cfg = config(
        runs.path(),
        &[("data.eval", eval.as_str()), ("eval.max_samples", "3")],
    );
    let out = crate::job::train(&cfg, None).unwrap();
    let text = std::fs::read_to_string(out.run_dir.join(MEMORY_PLAN_FILE)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dev = &v["devices"][0];
    assert!(dev["peak_bytes"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(dev["model"]["attention"], "reference", "{v}");
    assert!(v["micro"]["ctx_rows"].as_u64().unwrap() <= 512, "{v}");
    // Three evaluation samples of at most max_len tokens, k = 2 features of the tiny
    // target's hidden size, f32, held in host memory for the run.
    let hidden = JobPlan::new(&cfg).unwrap().target_config.hidden_size as u64;
    let eval_term = dev["terms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "evaluation features")
        .unwrap_or_else(|| panic!("no evaluation term: {v}"));
    assert_eq!(
        eval_term["bytes"].as_u64().unwrap(),
        3 * 256 * 2 * hidden * 4,
        "{v}"
    );
}

#[test]
fn the_largest_micro_batch_bounds_blocks_by_anchors_and_document_length() {
    let schedule = Schedule {
        steps: vec![crate::schedule::StepWork {
            epoch: 0,
            micro: vec![vec![0, 1], vec![2]],
        }],
    };
    // Documents of 3, 100 and 50 tokens with 8 anchors each at most: 2 + 8, then 8.
    let m = largest_micro(&schedule, &[3, 100, 50], 8);
    assert_eq!(
        m,
        MicroShape {
            ctx_rows: 103,
            blocks: 10
        }
    );
}

/// A target that ties its LM head to its embedding holds one `(V, H)` table, and the plan
/// counts one.
#[test]
fn a_tied_targets_embedding_and_lm_head_are_counted_once() {
    let runs = tempfile::tempdir().unwrap();
    let mut plan = JobPlan::new(&config(runs.path(), &[])).unwrap();
    let b = [reference()];
    let frozen = |plan: &JobPlan| -> u64 {
        MemoryPlan::new(plan, &b, &b).devices[0]
            .terms
            .iter()
            .filter(|t| t.name == "frozen embedding + LM head")
            .map(|t| t.bytes)
            .sum()
    };
    assert!(!plan.target_config.tie_word_embeddings);
    let untied = frozen(&plan);
    plan.target_config.tie_word_embeddings = true;
    assert_eq!(2 * frozen(&plan), untied);
}

/// The 8B recipe's drafter step (5 layers, S = 3072, 512 anchors x 16, k = 5) on the CUDA
/// backend's model (bf16 GEMMs and activations, `cuda-flash`), against the peaks the H200
/// measured (`dflash bench`'s `drafter.step.*.peak_memory`, recorded in
/// `bench/results/nvidia-h200.json`; every such figure there is compared).
#[test]
fn the_8b_recipe_on_the_cuda_model_matches_the_h200s_recorded_peaks() {
    let target = dflash_config::Qwen3Config {
        model_type: "qwen3".into(),
        vocab_size: 151_936,
        hidden_size: 4096,
        intermediate_size: 12288,
        num_hidden_layers: 36,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        max_position_embeddings: 40960,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_id: None,
        dtype: None,
    };
    let shape = dflash_config::DrafterShape::standard(151_669);
    let d = dflash_config::DrafterConfig::for_target(&target, &shape).unwrap();
    let m = BackendModel {
        ops: OpsKind::Cuda,
        attention: AttentionKind::CudaFlash,
        act: 2,
        compute: 2,
        rounding: dflash_core::AllocationRounding::Exact,
    };
    let mb = MicroShape {
        ctx_rows: 3072,
        blocks: 512,
    };
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/results/nvidia-h200.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut compared = Vec::new();
    for r in v.as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        let Some(rest) = name.strip_prefix("drafter.step.") else {
            continue;
        };
        let Some(rest) = rest.strip_suffix(".peak_memory") else {
            continue;
        };
        let (recompute, b) = match rest.strip_prefix("recompute.") {
            Some(b) => (true, b),
            None => (false, rest),
        };
        let batch: usize = b.trim_start_matches('b').parse().unwrap();
        let measured = r["value"].as_f64().unwrap();
        let plan = gib(DrafterPlan::new(&d, mb, batch, recompute, &m).peak);
        compared.push(format!(
            "{name}: plan {plan:.3} GiB, measured {measured:.3} GiB"
        ));
        assert!(
            (plan / measured - 1.0).abs() <= 0.1,
            "{}",
            compared.join("\n")
        );
    }
    assert!(compared.len() >= 3, "{compared:?}");
    eprintln!("{}", compared.join("\n"));
}

/// The background checkpoint's snapshot (replica 0's weights and moments) is a term where it
/// fits, and a plan whose device has no room for it writes checkpoints in place instead of
/// being refused.
#[test]
fn the_checkpoint_snapshot_is_planned_where_it_fits_and_dropped_where_it_does_not() {
    let runs = tempfile::tempdir().unwrap();
    let plan = JobPlan::new(&config(runs.path(), &[])).unwrap();
    let b = [reference()];
    let (t, d) = (placed(&b), placed(&b));
    let knobs = Knobs {
        micro: plan.largest_micro(plan.cfg.data.num_anchors),
        recompute: false,
        queue_capacity: 2,
        snapshot: true,
    };
    let with = MemoryPlan::with_knobs(&plan, &t, &d, knobs);
    let term = |p: &MemoryPlan, name: &str| {
        p.devices[0]
            .terms
            .iter()
            .find(|x| x.name == name)
            .map(|x| x.bytes)
    };
    let weights = term(&with, "drafter weights").unwrap();
    assert_eq!(term(&with, "checkpoint snapshot"), Some(3 * weights));
    assert!(with.background_checkpoints);
    assert!(with.table().contains("checkpoints in the background"));
    let without = MemoryPlan::with_knobs(
        &plan,
        &t,
        &d,
        Knobs {
            snapshot: false,
            ..knobs
        },
    );
    assert_eq!(term(&without, "checkpoint snapshot"), None);
    assert_eq!(
        without.devices[0].peak_bytes + 3 * weights,
        with.devices[0].peak_bytes
    );
    // Free memory between the two peaks: the snapshot is dropped, the job still fits.
    let mut p = with.clone();
    p.devices[0].free_bytes = Some(without.devices[0].peak_bytes + weights);
    assert!(!p.fits());
    let mut q = without.clone();
    q.devices[0].free_bytes = p.devices[0].free_bytes;
    assert!(q.fits() && !q.background_checkpoints);
    q.check(&plan, &b, &b).unwrap();
    // What `MemoryPlan::new` does with that free memory: the plan without the snapshot, which
    // says why its checkpoints are written in place.
    let (plan, t, d) = (&plan, &t, &d);
    let between = |free: u64| {
        move |k: Knobs| {
            let mut p = MemoryPlan::with_knobs(plan, t, d, k);
            p.devices[0].free_bytes = Some(free);
            p
        }
    };
    let dropped =
        MemoryPlan::snapshot_where_it_fits(knobs, between(without.devices[0].peak_bytes + weights));
    assert!(dropped.fits() && !dropped.background_checkpoints && dropped.snapshot_wanted);
    assert_eq!(dropped.devices[0].peak_bytes, without.devices[0].peak_bytes);
    let table = dropped.table();
    assert!(
        table.contains("checkpoints in place (no room for a snapshot)"),
        "{table}"
    );
    // With room, the snapshot stays.
    let kept = MemoryPlan::snapshot_where_it_fits(knobs, between(with.devices[0].peak_bytes));
    assert!(kept.background_checkpoints && kept.snapshot_wanted);
}

/// Rounded tensor by tensor with no rounding, the state and the target's weights are the
/// element counts the rest of the plan uses (the per-tensor layouts agree with the totals);
/// with the wgpu pool's size classes each grows, by at most an eighth.
#[test]
fn per_tensor_rounding_agrees_with_the_totals_and_adds_at_most_its_fraction() {
    let tcfg = config(Path::new("/tmp"), &[]);
    let plan = JobPlan::new(&tcfg).unwrap();
    let (d, t) = (&plan.drafter, &plan.target_config);
    let exact = BackendModel::reference();
    let classes = BackendModel {
        rounding: dflash_core::AllocationRounding::SizeClasses {
            per_octave: 8,
            min_bytes: 256,
        },
        ..exact
    };
    assert_eq!(step::drafter_state_on(d, &exact), step::drafter_state(d));
    let depth = t.num_hidden_layers;
    let (layers, frozen) = step::target_weights(t, depth, &exact);
    let l = step::target_layer(t, &exact);
    let h = t.hidden_size as u128;
    assert_eq!(
        layers,
        depth as u128 * (l.matrix_elems() + l.norm_elems()) * 4 + h * 4
    );
    assert_eq!(frozen, 2 * t.vocab_size as u128 * h * 4);
    let within = |got: u128, want: u128| want <= got && got <= want + want / 8 + 256 * 64;
    let state = step::drafter_state(d);
    assert!(within(step::drafter_state_on(d, &classes), state));
    let (layers_c, frozen_c) = step::target_weights(t, depth, &classes);
    assert!(within(layers_c, layers) && within(frozen_c, frozen));
    // The embedded default's norms (256 B and less) take a whole 256-byte class each.
    assert!(step::drafter_state_on(d, &classes) > state);
}

/// The evaluation set's features live in host memory as f32 for the whole run, whatever the
/// backend: a set larger than the host's free memory is refused naming eval.max_samples.
#[test]
fn an_evaluation_set_larger_than_host_memory_is_refused_naming_eval_max_samples() {
    let runs = tempfile::tempdir().unwrap();
    let plan = JobPlan::new(&config(
        runs.path(),
        &[
            ("data.eval", &format!("{TINY_TRAIN:?}")),
            ("eval.max_samples", "40"),
        ],
    ))
    .unwrap();
    assert_eq!(plan.eval_samples, 40);
    let need = eval_features_bytes(&plan);
    // 2 target layers x hidden 128 x 4 bytes a token.
    assert_eq!(need, plan.eval_tokens as u64 * 2 * 128 * 4);
    let host = |free: u64| {
        Some(dflash_core::MemoryCapacity {
            free,
            total: 4 * need,
        })
    };
    check_eval_features(&plan, host(need)).unwrap();
    check_eval_features(&plan, None).unwrap();
    let e = check_eval_features(&plan, host(need / 4))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("does not fit in host memory")
            && e.contains("eval.max_samples (now 40) to about 10"),
        "{e}"
    );
    // Without an evaluation set, nothing is kept.
    let none = JobPlan::new(&config(runs.path(), &[])).unwrap();
    assert_eq!(eval_features_bytes(&none), 0);
    check_eval_features(&none, host(0)).unwrap();
}

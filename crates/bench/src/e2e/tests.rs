use super::PartsPerStep;

/// Session 19's H100 figures (bench/results/nvidia-h100-session19.json): 8672 tokens and
/// 4.67 documents a step, the target at 40.18 K tok/s (215.8 ms), a whole drafter step of
/// 149.1 ms of which the optimizer is 13.8. Once a step: 215.8 + 4.67 x 135.3 + 13.8 =
/// 861.5 ms, 10.07 K tok/s; a whole step per document would give 912.1 ms, 9.51.
#[test]
fn the_optimizer_is_paid_once_a_step() {
    let parts = PartsPerStep {
        tokens: 8672.0,
        docs: 4.67,
        target_k_tok_s: 40.18,
        drafter_step_s: 0.1491,
        optimizer_s: 0.0138,
    };
    assert!(
        (parts.target_s() - 0.21583).abs() < 1e-4,
        "{}",
        parts.target_s()
    );
    assert!((parts.drafter_s() - (4.67 * 0.1353 + 0.0138)).abs() < 1e-9);
    assert!(
        (parts.bound_k_tok_s() - 10.07).abs() < 0.005,
        "{}",
        parts.bound_k_tok_s()
    );
    let per_document = PartsPerStep {
        optimizer_s: 0.0,
        ..parts
    };
    assert!((per_document.bound_k_tok_s() - 9.51).abs() < 0.005);
    // Medians of different runs: an optimizer median above the whole step's prices the
    // forward+backward at zero, never below.
    let inverted = PartsPerStep {
        drafter_step_s: 0.010,
        ..parts
    };
    assert_eq!(inverted.drafter_s(), 0.0138);
}

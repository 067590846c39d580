//! Fuzz properties of the config parsers: a mutated target or drafter `config.json`, job
//! TOML or `--set` override, or arbitrary text, parses as `Ok` or a typed [`ConfigError`],
//! never a panic; a drafter config that parses writes back to JSON that parses to the same
//! config (floats to an ulp) (cases: `DFLASH_FUZZ_CASES`, see `mutate`).

#[path = "../../data/tests/mutate/mod.rs"]
mod mutate;

use std::path::Path;

use dflash_config::{ConfigError, DrafterConfig, Qwen3Config, TrainConfig};
use proptest::prelude::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
const DEFAULT_TOML: &str = include_str!("../../../configs/default.toml");
const RECIPE_TOML: &str = include_str!("../../../configs/qwen3-8b.toml");

fn fixture(name: &str) -> String {
    std::fs::read_to_string(Path::new(FIXTURES).join(name)).unwrap()
}

fn typed(r: Result<impl Sized, ConfigError>) {
    if let Err(e) = r {
        assert!(!e.to_string().is_empty());
    }
}

proptest! {
    #![proptest_config(mutate::config())]

    #[test]
    fn target_config_json_never_panics(text in prop_oneof![
        mutate::text_input(&fixture("target_qwen3-8b.json")),
        mutate::text_input(&fixture("target_tiny_v5.json")),
    ]) {
        typed(Qwen3Config::from_json_str(&text, "fuzz"));
    }

    #[test]
    fn drafter_config_json_never_panics_and_round_trips(text in prop_oneof![
        mutate::text_input(&fixture("config_qwen3-8b-dflash.json")),
        mutate::text_input(&fixture("config_qwen3.6-27b-dflash.json")),
    ]) {
        match DrafterConfig::from_json_str(&text, "fuzz") {
            Ok(d) => {
                let again = DrafterConfig::from_json_str(&d.to_json().to_string(), "again");
                prop_assert!(again.is_ok(), "{:?}", again);
                let mut again = again.unwrap();
                // serde_json parses floats best-effort (no `float_roundtrip` feature): some
                // spellings (`1e-86`) read an ulp off, and so differ once written shortest.
                for (a, b) in [
                    (&mut again.rms_norm_eps, d.rms_norm_eps),
                    (&mut again.rope_theta, d.rope_theta),
                    (&mut again.initializer_range, d.initializer_range),
                ] {
                    prop_assert!((*a - b).abs() <= 1e-15 * b.abs(), "{} vs {}", a, b);
                    *a = b;
                }
                prop_assert_eq!(again, d);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn job_toml_never_panics(text in prop_oneof![
        mutate::text_input(DEFAULT_TOML),
        mutate::text_input(RECIPE_TOML),
    ]) {
        typed(TrainConfig::load_toml_str(&text, "fuzz", Path::new("/"), &[]));
    }

    /// `--set KEY=VALUE` with a mutated key or value over the default config.
    #[test]
    fn set_overrides_never_panic(
        key in mutate::text_input("data.max_len"),
        value in mutate::text_input("[512, 1024]"),
    ) {
        let over = [(key, value)];
        typed(TrainConfig::load_toml_str(DEFAULT_TOML, "fuzz", Path::new("/"), &over));
    }
}

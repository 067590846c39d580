//! `backend.attention = "plugin:PATH"` is resolved against the same base as `plugins.paths`,
//! so a run resumed from another directory still finds its plugin library.

use std::path::Path;

use dflash_config::TrainConfig;

fn resolved(attention: &str, base: &Path) -> String {
    let mut cfg = TrainConfig::default();
    cfg.backend.attention = attention.into();
    cfg.resolve_paths(base);
    cfg.backend.attention
}

#[test]
fn a_plugin_path_is_made_absolute_against_the_base() {
    let base = tempfile::tempdir().unwrap();
    let base = base.path();
    let join = |p: &str| format!("plugin:{}", base.join(p).display());
    assert_eq!(
        resolved("plugin:build/libx.so", base),
        join("build/libx.so")
    );
    assert_eq!(resolved("plugin:./libx.so", base), join("./libx.so"));
    // A bare name is a file under the base only if there is one; else the system's search.
    assert_eq!(resolved("plugin:libx.so", base), "plugin:libx.so");
    std::fs::write(base.join("libx.so"), b"").unwrap();
    assert_eq!(resolved("plugin:libx.so", base), join("libx.so"));
    // Absolute paths and in-tree names are left alone, so resolving again changes nothing.
    let abs = join("build/libx.so");
    assert_eq!(resolved(&abs, Path::new("/elsewhere")), abs);
    assert_eq!(resolved("reference", base), "reference");
}

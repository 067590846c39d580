//! The training job config, layered with figment (later layers win):
//!
//! 1. built-in defaults ([`TrainConfig::default`]),
//! 2. a TOML file (or TOML text),
//! 3. environment variables `DFLASH_<SECTION>__<KEY>` (`__` separates nesting levels, e.g.
//!    `DFLASH_TRAIN__LR=3e-4`, `DFLASH_DATA__BUCKET_BOUNDS=[512,1024]`). Only variables whose
//!    name contains `__` are read, so unrelated `DFLASH_*` variables (e.g. `DFLASH_LOG`) are left
//!    alone; a misspelt nested one is an unknown-key error,
//! 4. command-line overrides `key.path=value` (e.g. `train.lr=3e-4`), merged last.
//!
//! Values in environment variables and overrides are parsed as TOML literals: `true`, `12`,
//! `3e-4`, `[1, 2]`, `"quoted"`; anything that is not a TOML literal is taken as a string (so
//! `run.name=exp1` works, while a name that looks like a number must be quoted: `run.name='"7"'`).
//!
//! Unknown keys anywhere are errors that name the key and where it came from.
//!
//! **Paths**: relative paths (`target.path`, `drafter.init_from`, `data.train`, `data.eval`,
//! `run.dir`) are resolved against the *current working directory* of the process at load
//! time, not against the config file's directory, and stored absolute; so the config written
//! into a run directory ([`TrainConfig::to_toml_string`]) is valid from anywhere.
//! [`TrainConfig::load_toml_str`] resolves against an explicit base directory instead.

mod layering;
mod sections;
mod validate;

use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::{Figment, Profile, Provider};
use serde::{Deserialize, Serialize};

use crate::drafter::{
    DrafterConfig, DrafterShape, default_gamma, default_num_target_features, known_mask_token_id,
};
use crate::error::{ConfigError, InitFromMismatch, Result};
use crate::qwen3::Qwen3Config;
use layering::{KeyStyle, Layer, LayerData, env_provider, overrides_provider};

pub use layering::parse_overrides;
pub use sections::{
    BackendSection, Collective, DataSection, DrafterSection, EvalSection, PipelineSection,
    PlacementMode, PluginsSection, Routing, RunSection, TargetSection, TooLong, TrainSection,
};

/// Prefix of the environment variables read by [`TrainConfig::load`].
pub const ENV_PREFIX: &str = "DFLASH_";

/// Name of the defaults layer: a key whose value comes from it was not set by anyone.
const DEFAULTS_LAYER: &str = "built-in defaults";

/// The `[drafter]` keys that describe the drafter's shape, which a `drafter.init_from`
/// directory's `config.json` defines instead.
const SHAPE_KEYS: [&str; 9] = [
    "drafter.num_layers",
    "drafter.block_size",
    "drafter.mask_token_id",
    "drafter.target_layer_ids",
    "drafter.num_target_features",
    "drafter.intermediate_size",
    "drafter.num_attention_heads",
    "drafter.num_key_value_heads",
    "drafter.head_dim",
];

/// The whole training job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// The frozen target model.
    pub target: TargetSection,
    /// The drafter to train.
    pub drafter: DrafterSection,
    /// Datasets, lengths and batching.
    pub data: DataSection,
    /// Optimizer and schedule.
    pub train: TrainSection,
    /// Compute backend and attention kernel.
    pub backend: BackendSection,
    /// Target/drafter workers and the queues between them.
    pub pipeline: PipelineSection,
    /// Where runs are written.
    pub run: RunSection,
    /// Held-out evaluation (acceptance length).
    pub eval: EvalSection,
    /// Attention kernel plugins to load.
    pub plugins: PluginsSection,
}

impl TrainConfig {
    /// Loads the job config: defaults <- `file` (TOML) <- `DFLASH_*` env <- `overrides`, then
    /// resolves relative paths against the current directory and validates.
    /// A `file` that does not exist is an error (figment alone would silently skip it).
    pub fn load(file: Option<&Path>, overrides: &[(String, String)]) -> Result<Self> {
        let mut fig = Figment::from(Self::defaults_provider());
        if let Some(path) = file {
            std::fs::metadata(path).map_err(|source| ConfigError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            fig = fig.merge(Layer {
                name: "TOML file".into(),
                source: Some(figment::Source::File(path.to_path_buf())),
                data: LayerData::Toml(Toml::file_exact(path)),
                keys: KeyStyle::Dotted,
            });
        }
        Self::finish(fig, overrides, &cwd()?)
    }

    /// Like [`load`](Self::load) with TOML text in place of a file (e.g. an embedded default
    /// config); `name` is used in errors. Relative paths resolve against `base_dir`.
    pub fn load_toml_str(
        toml: &str,
        name: &str,
        base_dir: &Path,
        overrides: &[(String, String)],
    ) -> Result<Self> {
        let fig = Figment::from(Self::defaults_provider()).merge(Layer {
            name: format!("TOML text `{name}`"),
            source: None,
            data: LayerData::Toml(Toml::string(toml)),
            keys: KeyStyle::Dotted,
        });
        Self::finish(fig, overrides, base_dir)
    }

    /// Checks `overrides` (with the `DFLASH_*` environment, which joins them wherever they
    /// are applied) against the built-in defaults: every key must exist and every value have
    /// its field's type. Relations between fields are left to the config the overrides will
    /// meet (a bench applies them to each figure's recipe).
    pub fn check_overrides(overrides: &[(String, String)]) -> Result<()> {
        Figment::from(Self::defaults_provider())
            .merge(env_provider()?)
            .merge(overrides_provider(overrides)?)
            .extract::<TrainConfig>()?;
        Ok(())
    }

    fn defaults_provider() -> Layer {
        let data = Serialized::defaults(TrainConfig::default())
            .data()
            .ok()
            .and_then(|mut m| m.remove(&Profile::Default))
            .unwrap_or_default();
        Layer::dict(DEFAULTS_LAYER, data, KeyStyle::Dotted)
    }

    fn finish(fig: Figment, overrides: &[(String, String)], base_dir: &Path) -> Result<Self> {
        let fig = fig
            .merge(env_provider()?)
            .merge(overrides_provider(overrides)?);
        let mut cfg: TrainConfig = fig.extract()?;
        cfg.resolve_paths(base_dir);
        let set = |key: &str| {
            fig.find_metadata(key)
                .is_some_and(|md| md.name != DEFAULTS_LAYER)
        };
        let init_from = cfg.drafter.init_from.clone();
        // Which layer gave `field`; a shape key nobody set was taken from the init_from
        // drafter, so that is named instead of the defaults.
        let origin_of = |field: &str| match &init_from {
            Some(dir) if SHAPE_KEYS.contains(&field) && !set(field) => {
                format!("drafter.init_from {}", dir.display())
            }
            _ => fig
                .find_metadata(field)
                .map(|md| match &md.source {
                    Some(src) => format!("{} {}", md.name, src),
                    None => md.name.to_string(),
                })
                .unwrap_or_else(|| "training config".into()),
        };
        // The init_from drafter's own faults are errors of its config.json, which they name
        // already; only what follows is blamed on the layer that set the field.
        let loaded = match &init_from {
            Some(dir) => Some(DrafterConfig::from_dir(dir)?),
            None => None,
        };
        cfg.adopt_init_from(loaded.as_ref(), &set)
            .and_then(|()| cfg.validate())
            .map_err(|e| match e {
                ConfigError::Invalid { field, message, .. } => ConfigError::Invalid {
                    origin: origin_of(&field),
                    field,
                    message,
                },
                ConfigError::InitFromMismatch(mut m) => {
                    m.origin = origin_of(&m.field);
                    ConfigError::InitFromMismatch(m)
                }
                other => other,
            })?;
        Ok(cfg)
    }

    /// With `drafter.init_from`, the drafter is that directory's `config.json` (`loaded`, read
    /// by the caller): every shape key that `set` says was given must agree with it (else it
    /// would be silently ignored), and the `[drafter]` section then takes the loaded values.
    /// So the checks that follow (a block against `data.max_len`) see the drafter actually
    /// trained, and the config written into the run directory describes it and loads back (its
    /// keys are all "set" there).
    fn adopt_init_from(
        &mut self,
        loaded: Option<&DrafterConfig>,
        set: &dyn Fn(&str) -> bool,
    ) -> Result<()> {
        let (Some(loaded), Some(dir)) = (loaded, self.drafter.init_from.clone()) else {
            return Ok(());
        };
        self.check_init_from(loaded, &dir, set)?;
        let d = &mut self.drafter;
        d.num_layers = loaded.num_hidden_layers;
        d.block_size = loaded.block_size;
        d.mask_token_id = Some(loaded.mask_token_id);
        d.target_layer_ids = Some(loaded.target_layer_ids.clone());
        d.num_target_features = Some(loaded.target_layer_ids.len());
        d.intermediate_size = Some(loaded.intermediate_size);
        d.num_attention_heads = Some(loaded.num_attention_heads);
        d.num_key_value_heads = Some(loaded.num_key_value_heads);
        d.head_dim = Some(loaded.head_dim);
        Ok(())
    }

    /// Each shape key of [`SHAPE_KEYS`] that `set` says was given and that holds a value
    /// against `loaded`, the drafter of `drafter.init_from` (`dir`): the first that disagrees
    /// is an error naming the key, both values and `dir`.
    fn check_init_from(
        &self,
        loaded: &DrafterConfig,
        dir: &Path,
        set: &dyn Fn(&str) -> bool,
    ) -> Result<()> {
        let d = &self.drafter;
        let n = |v: Option<usize>| v.map(|v| v.to_string());
        let given = [
            Some(d.num_layers.to_string()),
            Some(d.block_size.to_string()),
            d.mask_token_id.map(|v| v.to_string()),
            d.target_layer_ids.as_ref().map(|v| format!("{v:?}")),
            n(d.num_target_features),
            n(d.intermediate_size),
            n(d.num_attention_heads),
            n(d.num_key_value_heads),
            n(d.head_dim),
        ];
        let has = [
            loaded.num_hidden_layers.to_string(),
            loaded.block_size.to_string(),
            loaded.mask_token_id.to_string(),
            format!("{:?}", loaded.target_layer_ids),
            loaded.target_layer_ids.len().to_string(),
            loaded.intermediate_size.to_string(),
            loaded.num_attention_heads.to_string(),
            loaded.num_key_value_heads.to_string(),
            loaded.head_dim.to_string(),
        ];
        for ((field, given), has) in SHAPE_KEYS.into_iter().zip(given).zip(has) {
            if let Some(given) = given
                && set(field)
                && given != has
            {
                return Err(ConfigError::InitFromMismatch(Box::new(InitFromMismatch {
                    origin: "training config".into(),
                    field: field.into(),
                    set: given,
                    loaded: has,
                    init_from: dir.to_path_buf(),
                })));
            }
        }
        Ok(())
    }

    /// Makes relative paths absolute by joining them to `base`, including the library of a
    /// `backend.attention = "plugin:PATH"`: the resolved config is written into the run
    /// directory and loaded again on `--resume`, possibly from another directory. A bare file
    /// name there is joined only when that file exists under `base`; otherwise it is left for
    /// the dynamic loader's own search (a library installed system-wide).
    pub fn resolve_paths(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        self.target.path.as_mut().map(fix);
        self.drafter.init_from.as_mut().map(fix);
        self.data.train.as_mut().map(fix);
        self.data.eval.as_mut().map(fix);
        fix(&mut self.run.dir);
        self.plugins.paths.iter_mut().for_each(fix);
        // The loader's `PREFIX`, spelled out: this crate does not depend on the loader.
        if let Some(lib) = self.backend.attention.strip_prefix("plugin:") {
            let path = Path::new(lib);
            let bare = path.parent().is_none_or(|d| d.as_os_str().is_empty());
            if path.is_relative() && !lib.is_empty() && (!bare || base.join(path).is_file()) {
                self.backend.attention = format!("plugin:{}", base.join(path).display());
            }
        }
    }

    /// The resolved config as TOML, for writing into the run directory. Loading it back gives
    /// an equal config.
    pub fn to_toml_string(&self) -> Result<String> {
        Ok(toml::to_string_pretty(self)?)
    }

    /// The target directory, or an error saying that `target.path` must be set.
    pub fn target_dir(&self) -> Result<&Path> {
        self.target
            .path
            .as_deref()
            .ok_or_else(|| ConfigError::Invalid {
                origin: "training config".into(),
                field: "target.path".into(),
                message: "not set: give the target's HF model directory".into(),
            })
    }

    /// The training dataset, or an error saying that `data.train` must be set.
    pub fn train_data(&self) -> Result<&Path> {
        self.data
            .train
            .as_deref()
            .ok_or_else(|| ConfigError::Invalid {
                origin: "training config".into(),
                field: "data.train".into(),
                message: "not set: give the training dataset directory".into(),
            })
    }

    /// The mask token id: `drafter.mask_token_id`, else the known one for the target.
    pub fn mask_token_id(&self, target: &Qwen3Config) -> Result<u32> {
        match self
            .drafter
            .mask_token_id
            .or_else(|| known_mask_token_id(target.vocab_size))
        {
            Some(id) => Ok(id),
            None => Err(ConfigError::Invalid {
                origin: "training config".into(),
                field: "drafter.mask_token_id".into(),
                message: format!(
                    "not set, and no default is known for a target with vocab_size {}; \
                     set it to an unused row of the target's embedding table",
                    target.vocab_size
                ),
            }),
        }
    }

    /// The drafter to train against `target`: loaded from `drafter.init_from` if set, else
    /// built by [`DrafterConfig::for_target`] from the `[drafter]` section; validated against
    /// the target either way.
    ///
    /// With `init_from`, a config from [`load`](Self::load) already agrees with the loaded
    /// drafter (every key set was checked, the rest filled in). A config built in code is
    /// checked here on the optional shape keys it holds (their default is none, so a value
    /// was set); its `num_layers` and `block_size` always hold one, set or not, so only the
    /// loader can tell. The loaded block is checked against `data.max_len` either way.
    pub fn drafter_config(&self, target: &Qwen3Config) -> Result<DrafterConfig> {
        let d = &self.drafter;
        if let Some(dir) = &d.init_from {
            let cfg = DrafterConfig::from_dir(dir)?;
            let optional = |key: &str| !matches!(key, "drafter.num_layers" | "drafter.block_size");
            self.check_init_from(&cfg, dir, &optional)?;
            cfg.validate_against(target)?;
            validate::check_block_fits(cfg.block_size, self.data.max_len).map_err(|e| match e {
                ConfigError::Invalid { field, message, .. } => ConfigError::Invalid {
                    origin: format!("drafter.init_from {}", dir.display()),
                    field,
                    message,
                },
                other => other,
            })?;
            return Ok(cfg);
        }
        let k = match (&d.target_layer_ids, d.num_target_features) {
            (_, Some(k)) => k,
            (Some(ids), None) => ids.len(),
            (None, None) => default_num_target_features(target.num_hidden_layers),
        };
        let shape = DrafterShape {
            num_layers: d.num_layers,
            block_size: d.block_size,
            mask_token_id: self.mask_token_id(target)?,
            num_target_features: k,
            target_layer_ids: d.target_layer_ids.clone(),
            intermediate_size: d.intermediate_size,
            num_attention_heads: d.num_attention_heads,
            num_key_value_heads: d.num_key_value_heads,
            head_dim: d.head_dim,
            ..DrafterShape::standard(0)
        };
        DrafterConfig::for_target(target, &shape)
    }

    /// Loss decay for a drafter of `block_size`: `data.gamma`, else [`default_gamma`].
    pub fn gamma(&self, block_size: usize) -> f64 {
        self.data.gamma.unwrap_or_else(|| default_gamma(block_size))
    }
}

fn cwd() -> Result<PathBuf> {
    std::env::current_dir().map_err(|source| ConfigError::Io {
        path: PathBuf::from("."),
        source,
    })
}

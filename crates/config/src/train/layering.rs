//! The figment layers of the training config: named providers (so errors say which layer a
//! bad key came from, in that layer's key style), the `DFLASH_*` environment layer, and
//! command-line `key.path=value` overrides parsed as TOML literals.

use figment::providers::Toml;
use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::ENV_PREFIX;
use crate::error::{ConfigError, Result};

/// How keys are shown in error messages.
#[derive(Clone, Copy)]
pub(super) enum KeyStyle {
    /// `train.lr`
    Dotted,
    /// `DFLASH_TRAIN__LR`
    Env,
}

/// One configuration layer with a readable name (and file, if any) in error messages.
pub(super) struct Layer {
    pub(super) name: String,
    pub(super) source: Option<figment::Source>,
    pub(super) data: LayerData,
    pub(super) keys: KeyStyle,
}

pub(super) enum LayerData {
    Dict(Dict),
    Toml(figment::providers::Data<Toml>),
}

impl Layer {
    pub(super) fn dict(name: &str, data: Dict, keys: KeyStyle) -> Self {
        Self {
            name: name.to_string(),
            source: None,
            data: LayerData::Dict(data),
            keys,
        }
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        let mut md = Metadata::named(self.name.clone());
        md.source = self.source.clone();
        match self.keys {
            KeyStyle::Env => md.interpolater(|_: &Profile, keys: &[&str]| {
                format!("{ENV_PREFIX}{}", keys.join("__").to_ascii_uppercase())
            }),
            KeyStyle::Dotted => md.interpolater(|_: &Profile, keys: &[&str]| keys.join(".")),
        }
    }

    fn data(&self) -> std::result::Result<Map<Profile, Dict>, figment::Error> {
        match &self.data {
            LayerData::Dict(d) => Ok(Profile::Default.collect(d.clone())),
            LayerData::Toml(t) => t.data(),
        }
    }
}

/// Splits command-line arguments `key.path=value` into `(key, value)` pairs, each trimmed (a
/// value's own spaces belong in a quoted TOML string, which keeps them).
pub fn parse_overrides<S: AsRef<str>>(args: &[S]) -> Result<Vec<(String, String)>> {
    args.iter()
        .map(|a| {
            let a = a.as_ref();
            match a.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => {
                    Ok((k.trim().to_string(), v.trim().to_string()))
                }
                _ => Err(ConfigError::Invalid {
                    origin: "command line".into(),
                    field: a.to_string(),
                    message: "an override must look like `section.key=value`".into(),
                }),
            }
        })
        .collect()
}

/// Parses an environment or command-line value as a TOML literal (`true`, `12`, `3e-4`,
/// `[1, 2]`, `"quoted"`); anything that is not one is taken as a plain string, and so is a
/// date or time (`2024-01-01`, `12:30:00`: no field is one, and run names often are).
fn parse_value(raw: &str) -> Value {
    let literal = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .filter(|t| t.len() == 1)
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !matches!(v, toml::Value::Datetime(_)))
        .and_then(|v| Value::serialize(v).ok());
    literal.unwrap_or_else(|| Value::from(raw.to_string()))
}

/// Nests `key.path = value` pairs into one dict; `origin` names the source in errors.
fn nest_pairs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    origin: &str,
) -> Result<Dict> {
    let mut dict = Dict::new();
    for (k, v) in pairs {
        if k.split('.').any(str::is_empty) {
            return Err(ConfigError::Invalid {
                origin: origin.into(),
                field: k.to_string(),
                message: "not a valid key path (expected `section.key`)".into(),
            });
        }
        let nested = figment::util::nest(k, parse_value(v))
            .into_dict()
            .expect("a non-empty key path nests into a dict");
        dict = merge_dicts(dict, nested);
    }
    Ok(dict)
}

pub(super) fn overrides_provider(overrides: &[(String, String)]) -> Result<Layer> {
    let pairs = overrides.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    Ok(Layer::dict(
        "command-line override",
        nest_pairs(pairs, "command-line override")?,
        KeyStyle::Dotted,
    ))
}

/// `DFLASH_SECTION__KEY=value` variables (only names containing `__`), as a provider.
pub(super) fn env_provider() -> Result<Layer> {
    let mut pairs = Vec::new();
    for (name, value) in std::env::vars_os() {
        let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else {
            continue;
        };
        if let Some(rest) = name.strip_prefix(ENV_PREFIX) {
            if rest.contains("__") {
                pairs.push((
                    rest.to_ascii_lowercase().replace("__", "."),
                    value.to_string(),
                ));
            }
        }
    }
    pairs.sort();
    let data = nest_pairs(
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        ENV_SOURCE_NAME,
    )?;
    Ok(Layer::dict(ENV_SOURCE_NAME, data, KeyStyle::Env))
}

const ENV_SOURCE_NAME: &str = "`DFLASH_` environment variable(s)";

/// Later keys win, nested dicts merge.
fn merge_dicts(mut a: Dict, b: Dict) -> Dict {
    for (k, v) in b {
        let merged = match (a.remove(&k), v) {
            (Some(Value::Dict(_, x)), Value::Dict(tag, y)) => Value::Dict(tag, merge_dicts(x, y)),
            (_, v) => v,
        };
        a.insert(k, merged);
    }
    a
}

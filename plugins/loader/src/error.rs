//! What can go wrong between the host and a plugin: every message names the plugin (its path
//! or name) and the call.

/// A plugin failure.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("attention plugin {plugin}: cannot load the library: {reason}")]
    Load { plugin: String, reason: String },

    #[error("attention plugin {plugin}: missing symbol {symbol:?}: {reason}")]
    MissingSymbol {
        plugin: String,
        symbol: &'static str,
        reason: String,
    },

    #[error(
        "attention plugin {plugin}: ABI version mismatch: the host speaks {host_major}.{host_minor}, {detail}"
    )]
    Version {
        plugin: String,
        host_major: u32,
        host_minor: u32,
        detail: String,
    },

    #[error("attention plugin {plugin}: malformed plugin table: {detail}")]
    Malformed { plugin: String, detail: String },

    #[error("attention plugin {plugin} {call}: needs {need}, which the plugin does not declare")]
    MissingCapability {
        plugin: String,
        call: &'static str,
        need: String,
    },

    #[error("attention plugin {plugin} {call}: returned {status} ({name}): {message}")]
    Status {
        plugin: String,
        call: &'static str,
        status: i32,
        name: &'static str,
        message: String,
    },

    #[error("attention plugin {plugin}: kernel name {name:?} is already taken by {by}")]
    NameTaken {
        plugin: String,
        name: String,
        by: String,
    },

    #[error("attention plugin {plugin} {call}: {detail}")]
    Call {
        plugin: String,
        call: &'static str,
        detail: String,
    },
}

impl From<PluginError> for dflash_core::Error {
    fn from(e: PluginError) -> Self {
        dflash_core::Error::op("load attention plugin", "host", e.to_string())
    }
}

//! The C example plugin (`src/attention.c`), compiled by the build script into a shared library
//! at [`LIBRARY`]: load it with `backend.attention = "plugin:<LIBRARY>"` or
//! `cargo xtask conformance --plugin <LIBRARY>`.

/// Path of the shared library the build script compiled.
pub const LIBRARY: &str = env!("DFLASH_C_ATTENTION_LIB");

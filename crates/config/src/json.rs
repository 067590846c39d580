//! Typed field access on a parsed JSON object, with errors that name the file and the field.
//! (serde's derive errors name neither the field of a wrong-typed value nor the file.)

use serde_json::{Map, Value};

use crate::error::{ConfigError, Result};

/// Reads a file's text, or a `ConfigError::Io` naming the path.
pub(crate) fn read_text(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses `text` as a JSON object.
pub(crate) fn parse_object(text: &str, origin: &str) -> Result<Map<String, Value>> {
    let v: Value = serde_json::from_str(text).map_err(|source| ConfigError::Json {
        origin: origin.to_string(),
        source,
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ConfigError::WrongType {
            origin: origin.to_string(),
            field: "(top level)".into(),
            expected: "a JSON object",
            found: describe(&other),
        }),
    }
}

/// A short description of a JSON value for error messages.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(a) => format!("an array of {} element(s)", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

/// A JSON object plus where it came from; `prefix` is the dotted path of the object inside the
/// file (`""` at top level, `"dflash_config."` inside it), used in field names of errors.
pub(crate) struct Obj<'a> {
    pub origin: &'a str,
    pub prefix: String,
    pub map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    pub fn new(origin: &'a str, map: &'a Map<String, Value>) -> Self {
        Self {
            origin,
            prefix: String::new(),
            map,
        }
    }

    pub fn field(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// The value, `None` when absent or `null`.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn missing(&self, key: &str) -> ConfigError {
        ConfigError::MissingField {
            origin: self.origin.to_string(),
            field: self.field(key),
        }
    }

    pub fn wrong(&self, key: &str, expected: &'static str, v: &Value) -> ConfigError {
        ConfigError::WrongType {
            origin: self.origin.to_string(),
            field: self.field(key),
            expected,
            found: describe(v),
        }
    }

    pub fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.to_string(),
            field: self.field(key),
            message: message.into(),
        }
    }

    pub fn unsupported(&self, key: &str, value: &Value, reason: impl Into<String>) -> ConfigError {
        ConfigError::Unsupported {
            origin: self.origin.to_string(),
            field: self.field(key),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) => usize::try_from(n)
                    .map(Some)
                    .map_err(|_| self.invalid(key, format!("{n} is too large"))),
                None => Err(self.wrong(key, "a non-negative integer", v)),
            },
        }
    }

    pub fn req_usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.opt_usize(key)? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| self.invalid(key, format!("token id {n} does not fit in 32 bits"))),
        }
    }

    pub fn req_u32(&self, key: &str) -> Result<u32> {
        self.opt_u32(key)?.ok_or_else(|| self.missing(key))
    }

    /// Accepts integers and floats.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }

    pub fn req_f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "a boolean", v)),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&'a Vec<Value>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong(key, "an array", v)),
        }
    }

    pub fn opt_usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        let Some(a) = self.opt_array(key)? else {
            return Ok(None);
        };
        a.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.wrong(&format!("{key}[{i}]"), "a non-negative integer", v))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A nested object, as an `Obj` whose field names carry the `key.` prefix.
    pub fn opt_obj(&self, key: &str) -> Result<Option<Obj<'a>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(Obj {
                origin: self.origin,
                prefix: format!("{}{}.", self.prefix, key),
                map: m,
            })),
            Some(v) => Err(self.wrong(key, "an object", v)),
        }
    }

    /// A string field that must equal `expected` when present.
    pub fn expect_str_if_present(&self, key: &str, expected: &str, reason: &str) -> Result<()> {
        match self.opt_str(key)? {
            Some(s) if s != expected => Err(self.unsupported(key, &Value::from(s), reason)),
            _ => Ok(()),
        }
    }

    /// A boolean field that must equal `expected` when present.
    pub fn expect_bool_if_present(&self, key: &str, expected: bool, reason: &str) -> Result<()> {
        match self.opt_bool(key)? {
            Some(b) if b != expected => Err(self.unsupported(key, &Value::from(b), reason)),
            _ => Ok(()),
        }
    }
}

/// A number as JSON: integral values as integers (as HF writes `"rope_theta": 1000000`), others
/// as floats.
pub(crate) fn number(x: f64) -> Value {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 {
        if x >= 0.0 {
            Value::from(x as u64)
        } else {
            Value::from(x as i64)
        }
    } else {
        Value::from(x)
    }
}

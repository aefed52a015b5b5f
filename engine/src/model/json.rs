//! Typed reads of config.json values, each error naming the file and the key.

use serde_json::{Map, Value};

use crate::error::{EngineError, Result};

/// One JSON object of a config file.
pub(crate) struct Obj<'a> {
    pub file: &'a str,
    pub map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    pub fn new(file: &'a str, value: &'a Value, what: &str) -> Result<Self> {
        match value.as_object() {
            Some(map) => Ok(Self { file, map }),
            None => Err(err(file, what, "is not a JSON object")),
        }
    }

    /// The value under `key`, `None` when absent or null.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn obj(&self, key: &str) -> Result<Option<Obj<'a>>> {
        self.get(key).map(|v| Obj::new(self.file, v, key)).transpose()
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| err(self.file, key, "is required"))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| v.as_u64().map(|n| n as usize).ok_or_else(|| err(self.file, key, "is not a non-negative integer")))
            .transpose()
    }

    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        Ok(self.opt_usize(key)?.unwrap_or(default))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|v| v.as_f64().ok_or_else(|| err(self.file, key, "is not a number"))).transpose()
    }

    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        Ok(self.opt_f64(key)?.unwrap_or(default))
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| err(self.file, key, "is not a boolean")))
            .transpose()
            .map(|b| b.unwrap_or(default))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key).map(|v| v.as_str().ok_or_else(|| err(self.file, key, "is not a string"))).transpose()
    }

    pub fn str_or(&self, key: &str, default: &'a str) -> Result<&'a str> {
        Ok(self.opt_str(key)?.unwrap_or(default))
    }

    pub fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| err(self.file, key, "holds a non-string")))
                .collect(),
            Some(_) => Err(err(self.file, key, "is not a list of strings")),
        }
    }
}

pub(crate) fn err(file: &str, key: &str, reason: impl Into<String>) -> EngineError {
    EngineError::Config { file: file.into(), key: key.into(), reason: reason.into() }
}

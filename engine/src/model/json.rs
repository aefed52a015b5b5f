//! config.json values into the typed structs of [`super::config`] and [`super::quant_config`]
//! (serde derive), every error naming the file and the path of the key it is about
//! (`serde_path_to_error`): `rope_scaling.factor`, `quantization_config.ignore[2]`.
//!
//! Every JSON input (config.json, the shard index, a cost model) is read by [`read_capped`].
//!
//! The structs take every key as an `Option`, so that JSON `null` reads as absent (transformers writes
//! `null` for unset values) and defaults, required keys and limits stay with the code that knows them.

use std::io::Read;
use std::path::Path;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{EngineError, Result};

/// The UTF-8 byte order mark.
const BOM: char = '\u{feff}';

/// The text of the JSON input `path`, `what` it is in errors ("a config.json"): a regular file
/// ([`kdtree_quant::open_regular`]: a FIFO would block, a device never end) of at most `limit` bytes,
/// [`EngineError::FileTooLarge`] beyond. The size is checked before reading and the read is bounded
/// too (a file may grow while read), so a huge file fails at once, not after gigabytes. A UTF-8 byte
/// order mark, which editors on Windows put first and serde_json calls an unexpected character, is
/// dropped.
pub(crate) fn read_capped(path: &Path, what: &'static str, limit: u64) -> Result<String> {
    let file = path.display().to_string();
    let io = |source| EngineError::Io { file: file.clone(), source };
    let too_large = || EngineError::FileTooLarge { file: file.clone(), what, limit };
    let opened = kdtree_quant::open_regular(path).map_err(io)?;
    if opened.metadata().map_err(io)?.len() > limit {
        return Err(too_large());
    }
    let mut text = String::new();
    opened.take(limit + 1).read_to_string(&mut text).map_err(io)?;
    if text.len() as u64 > limit {
        return Err(too_large());
    }
    if text.starts_with(BOM) {
        text.drain(..BOM.len_utf8());
    }
    Ok(text)
}

/// `value` as a `T`; `section` is where `value` sits in the file ("" for the root), prefixed to the
/// key path of an error.
pub(crate) fn read<T: DeserializeOwned>(file: &str, section: &str, value: &Value) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let key = match (section, path.as_str()) {
            ("", ".") => "<root>".to_owned(),
            (s, ".") => s.to_owned(),
            ("", p) => p.to_owned(),
            (s, p) => format!("{s}.{p}"),
        };
        err(file, &key, e.into_inner().to_string())
    })
}

/// A key whose presence means something even when its value is `null`: absent gives `None`, `null`
/// `Some(None)` (with `#[serde(default, deserialize_with = "present")]`).
pub(crate) fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> std::result::Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The error of key `key` of `file`.
pub(crate) fn err(file: &str, key: &str, reason: impl Into<String>) -> EngineError {
    EngineError::Config { file: file.into(), key: key.into(), reason: reason.into() }
}

/// `e` with `section.` put before its key, when it is a [`EngineError::Config`].
pub(crate) fn under(section: &str, e: EngineError) -> EngineError {
    match e {
        EngineError::Config { file, key, reason } if !section.is_empty() => {
            let key = if key == "<root>" { section.to_owned() } else { format!("{section}.{key}") };
            EngineError::Config { file, key, reason }
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Inner {
        #[allow(dead_code)]
        n: Option<usize>,
    }

    #[derive(Debug, Deserialize)]
    struct Outer {
        #[allow(dead_code)]
        inner: Option<Inner>,
        #[allow(dead_code)]
        names: Option<Vec<String>>,
        #[serde(default, deserialize_with = "present")]
        rank: Option<Option<usize>>,
    }

    fn key_of(e: EngineError) -> String {
        match e {
            EngineError::Config { key, .. } => key,
            e => panic!("{e}"),
        }
    }

    #[test]
    fn errors_name_the_path_of_the_key() {
        let e = read::<Outer>("c.json", "", &json!({"inner": {"n": -1}})).unwrap_err();
        assert_eq!(key_of(e), "inner.n");
        let e = read::<Outer>("c.json", "text_config", &json!({"names": ["a", 3]})).unwrap_err();
        assert_eq!(key_of(e), "text_config.names[1]");
        let e = read::<Outer>("c.json", "", &json!("not an object")).unwrap_err();
        assert_eq!(key_of(e), "<root>");
        assert_eq!(key_of(under("text_config", err("c.json", "vocab_size", "is required"))), "text_config.vocab_size");
    }

    #[test]
    fn null_is_absent_except_where_presence_counts() {
        let o: Outer = read("c.json", "", &json!({"inner": null})).unwrap();
        assert!(o.inner.is_none() && o.rank.is_none());
        let o: Outer = read("c.json", "", &json!({"rank": null})).unwrap();
        assert_eq!(o.rank, Some(None));
        let o: Outer = read("c.json", "", &json!({"rank": 8})).unwrap();
        assert_eq!(o.rank, Some(Some(8)));
    }
}

//! Where a generation ends: the checkpoint's end-of-sequence ids, and stop strings found in the
//! text as it streams.

use std::path::Path;

use serde::Deserialize;

use super::MAX_CONFIG_BYTES;
use crate::error::{EngineError, Result};
use crate::model::json::read_capped;

/// `eos_token_id` as the configs write it: one id or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Ids {
    One(u32),
    List(Vec<u32>),
}

#[derive(Deserialize)]
struct WithEos {
    eos_token_id: Option<Ids>,
    /// A multimodal config.json keeps the text model's under here.
    text_config: Option<Box<WithEos>>,
}

/// The end-of-sequence ids of the model folder `dir`: `eos_token_id` of `generation_config.json`
/// (what transformers' `generate` stops on), else of `config.json` (or its `text_config`); empty
/// when neither says.
pub fn eos_token_ids(dir: &Path) -> Result<Vec<u32>> {
    for name in ["generation_config.json", "config.json"] {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let file = path.display().to_string();
        let text = read_capped(&path, "a generation or model config", MAX_CONFIG_BYTES)?;
        let config: WithEos = serde_json::from_str(&text).map_err(|e| EngineError::Config {
            file,
            key: "eos_token_id".into(),
            reason: format!("{e}: expected a token id or a list of them"),
        })?;
        let ids = config.eos_token_id.or_else(|| config.text_config.and_then(|t| t.eos_token_id));
        match ids {
            Some(Ids::One(id)) => return Ok(vec![id]),
            Some(Ids::List(ids)) => return Ok(ids),
            None => {}
        }
    }
    Ok(Vec::new())
}

/// Stop strings looked for in streamed text. Text that may be the start of one is held back until
/// it is known not to be, so that what is emitted never contains a stop string nor begins one that
/// then completes (the OpenAI API's `stop`: the string itself is not part of the answer).
#[derive(Clone, Debug, Default)]
pub(crate) struct StopText {
    stops: Vec<String>,
    held: String,
}

impl StopText {
    /// Empty strings stop nothing and are dropped.
    pub(crate) fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Takes the next piece of text; returns what may be shown now, and whether a stop string
    /// ended the generation (the text before it is then all there is).
    pub(crate) fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        let found = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = found {
            self.held.truncate(at);
            return (std::mem::take(&mut self.held), true);
        }
        // The longest tail of the held text that begins some stop string stays held.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let tail = self.held.split_off(keep);
        (std::mem::replace(&mut self.held, tail), false)
    }

    /// The text still held once the generation ended without a stop string.
    pub(crate) fn finish(self) -> String {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_string_across_pieces_is_cut_and_its_start_held_back() {
        let mut stop = StopText::new(["</answer>".to_owned(), String::new()]);
        assert_eq!(stop.push("The answer is 4</"), ("The answer is 4".to_owned(), false));
        assert_eq!(stop.push("ans"), (String::new(), false));
        assert_eq!(stop.push("wer> and more"), (String::new(), true));
        let mut stop = StopText::new(["</answer>".to_owned()]);
        assert_eq!(stop.push("a </b"), ("a </b".to_owned(), false));
        assert_eq!(stop.push(" <"), (" ".to_owned(), false));
        assert_eq!(stop.finish(), "<");
        let mut none = StopText::new([]);
        assert_eq!(none.push("你好"), ("你好".to_owned(), false));
    }

    #[test]
    fn eos_ids_come_from_generation_config_then_config() {
        let dir = tempfile::tempdir().unwrap();
        assert!(eos_token_ids(dir.path()).unwrap().is_empty());
        std::fs::write(dir.path().join("config.json"), r#"{"text_config": {"eos_token_id": 7}}"#).unwrap();
        assert_eq!(eos_token_ids(dir.path()).unwrap(), [7]);
        std::fs::write(dir.path().join("config.json"), r#"{"eos_token_id": 5, "text_config": {"eos_token_id": 7}}"#)
            .unwrap();
        assert_eq!(eos_token_ids(dir.path()).unwrap(), [5]);
        std::fs::write(dir.path().join("generation_config.json"), r#"{"eos_token_id": [1, 2]}"#).unwrap();
        assert_eq!(eos_token_ids(dir.path()).unwrap(), [1, 2]);
        std::fs::write(dir.path().join("generation_config.json"), r#"{"eos_token_id": "x"}"#).unwrap();
        let e = eos_token_ids(dir.path()).unwrap_err().to_string();
        assert!(e.contains("generation_config.json") && e.contains("`eos_token_id`"), "{e}");
    }
}

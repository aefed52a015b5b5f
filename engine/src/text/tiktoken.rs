//! Kimi's tokenizer: a tiktoken-format BPE (`tiktoken.model`: one `base64-token rank` pair a line),
//! the pre-tokenizer pattern of Kimi's `tokenization_kimi.py`, and its special tokens: the 256 ids
//! after the ranks, named by `tokenizer_config.json`'s `added_tokens_decoder` or
//! `<|reserved_token_{id}|>`.
//!
//! Our own small loader rather than the tiktoken-rs crate: the format and tiktoken's merge rule
//! (merge the adjacent pair of lowest rank, leftmost first, until none is a token) take a few dozen
//! lines, while tiktoken-rs bundles 8 MB of OpenAI vocabularies this engine never uses and panics on
//! a rank file that repeats a rank, which a bad file must not do here. The fixture tests check the
//! ids against the tiktoken package's.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine;
use fancy_regex::Regex as FancyRegex;
use regex::Regex;
use serde::Deserialize;

use crate::error::{EngineError, Result};
use crate::model::json::read_capped;

/// The split pattern of Kimi's `tokenization_kimi.py` (`pat_str`), verbatim: Han runs apart,
/// letters with their case, numbers in threes, punctuation, newlines, spaces.
const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Ids after the ranks kept for special tokens, as Kimi's tokenizer reserves them.
const RESERVED_SPECIAL: u32 = 256;

/// The most bytes a `tiktoken.model` may have (Kimi K2's has 2.8 MB).
const MAX_RANKS_BYTES: u64 = 256 << 20;

pub(super) struct Tiktoken {
    ranks: HashMap<Vec<u8>, u32>,
    /// Every id's bytes: the ranks' tokens, then the special tokens' text.
    bytes: HashMap<u32, Vec<u8>>,
    specials: HashMap<String, u32>,
    /// The special tokens, longest first, so that the leftmost-first match is the longest.
    special_regex: Regex,
    pattern: FancyRegex,
    /// The first special id: every id from here on is special.
    first_special: u32,
}

#[derive(Deserialize)]
struct AddedToken {
    content: String,
}

#[derive(Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    added_tokens_decoder: HashMap<String, AddedToken>,
}

impl Tiktoken {
    /// `tiktoken.model` of `dir`, with the special tokens of its `tokenizer_config.json` (if any).
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("tiktoken.model");
        let file = path.display().to_string();
        let bad = |line: usize, reason: String| EngineError::Tokenizer { file: format!("{file}:{line}"), reason };
        let text = read_capped(&path, "a tiktoken.model", MAX_RANKS_BYTES)?;
        let mut ranks = HashMap::new();
        let mut bytes = HashMap::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let (token, rank) = line.split_once(' ').ok_or_else(|| bad(i + 1, "is not `base64-token rank`".into()))?;
            let token = base64::engine::general_purpose::STANDARD
                .decode(token)
                .map_err(|e| bad(i + 1, format!("token `{token}` is not base64: {e}")))?;
            let rank: u32 = rank.trim().parse().map_err(|_| bad(i + 1, format!("rank `{rank}` is not a u32")))?;
            if bytes.insert(rank, token.clone()).is_some() || ranks.insert(token, rank).is_some() {
                return Err(bad(i + 1, format!("repeats rank {rank} or its token")));
            }
        }
        if let Some(byte) = (0..=255u8).find(|b| !ranks.contains_key(&[*b][..])) {
            let reason = format!("has no token for the byte {byte:#04x}: a byte-level BPE needs all 256");
            return Err(EngineError::Tokenizer { file, reason });
        }
        let first_special = ranks.values().max().map_or(0, |&r| r + 1);
        let specials = special_tokens(dir, first_special)?;
        for (name, &id) in &specials {
            bytes.insert(id, name.clone().into_bytes());
        }
        let mut names: Vec<&String> = specials.keys().collect();
        names.sort_by_key(|n| std::cmp::Reverse(n.len()));
        let alternation: Vec<String> = names.iter().map(|n| regex::escape(n)).collect();
        let special_regex = Regex::new(&alternation.join("|"))
            .map_err(|e| EngineError::Tokenizer { file: file.clone(), reason: format!("special tokens: {e}") })?;
        let pattern = FancyRegex::new(KIMI_PATTERN).expect("Kimi's pattern is a valid fancy-regex");
        Ok(Self { ranks, bytes, specials, special_regex, pattern, first_special })
    }

    /// Ids of `text`, its special tokens recognised as such (tiktoken's `allowed_special="all"`, as
    /// Kimi's tokenizer encodes).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut start = 0;
        for special in self.special_regex.find_iter(text) {
            self.encode_ordinary(&text[start..special.start()], &mut ids)?;
            ids.push(self.specials[special.as_str()]);
            start = special.end();
        }
        self.encode_ordinary(&text[start..], &mut ids)?;
        Ok(ids)
    }

    fn encode_ordinary(&self, text: &str, ids: &mut Vec<u32>) -> Result<()> {
        for piece in self.pattern.find_iter(text) {
            let piece = piece.map_err(|e| EngineError::Tokenizer {
                file: "tiktoken.model".into(),
                reason: format!("the pre-tokenizer pattern failed on the text: {e}"),
            })?;
            self.merge(piece.as_str().as_bytes(), ids);
        }
        Ok(())
    }

    /// tiktoken's byte-pair merge of one piece: the adjacent pair of lowest rank (leftmost among
    /// equals) is merged until no pair is a token. Every byte is a token ([`Self::load`] checks).
    fn merge(&self, piece: &[u8], ids: &mut Vec<u32>) {
        if let Some(&id) = self.ranks.get(piece) {
            return ids.push(id);
        }
        let mut bounds: Vec<usize> = (0..=piece.len()).collect();
        while let Some((_, i)) = (0..bounds.len().saturating_sub(2))
            .filter_map(|i| self.ranks.get(&piece[bounds[i]..bounds[i + 2]]).map(|&rank| (rank, i)))
            .min()
        {
            bounds.remove(i + 1);
        }
        ids.extend(bounds.windows(2).map(|w| self.ranks[&piece[w[0]..w[1]]]));
    }

    /// The bytes of `id`; `None` outside the vocabulary.
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(&id).map(Vec::as_slice)
    }

    pub(crate) fn is_special(&self, id: u32) -> bool {
        id >= self.first_special
    }

    /// Ids in use: the ranks and the reserved special ids.
    pub fn vocab_size(&self) -> usize {
        (self.first_special + RESERVED_SPECIAL) as usize
    }
}

/// The special tokens after `first` (Kimi's layout: [`RESERVED_SPECIAL`] ids, named by
/// `added_tokens_decoder` of `tokenizer_config.json` where it names them).
fn special_tokens(dir: &Path, first: u32) -> Result<HashMap<String, u32>> {
    let path = dir.join("tokenizer_config.json");
    let named: HashMap<u32, String> = if path.exists() {
        let file = path.display().to_string();
        let text = read_capped(&path, "a tokenizer_config.json", super::MAX_CONFIG_BYTES)?;
        let config: TokenizerConfig = serde_json::from_str(&text).map_err(|e| EngineError::Config {
            file: file.clone(),
            key: "added_tokens_decoder".into(),
            reason: e.to_string(),
        })?;
        let mut named = HashMap::new();
        for (id, token) in config.added_tokens_decoder {
            let key = format!("added_tokens_decoder.{id}");
            let id: u32 = id.parse().map_err(|_| EngineError::Config {
                file: file.clone(),
                key: key.clone(),
                reason: "is not a token id".into(),
            })?;
            if !(first..first + RESERVED_SPECIAL).contains(&id) {
                let reason =
                    format!("is outside the special ids {first}..{} after the ranks", first + RESERVED_SPECIAL);
                return Err(EngineError::Config { file, key, reason });
            }
            named.insert(id, token.content);
        }
        named
    } else {
        HashMap::new()
    };
    Ok((first..first + RESERVED_SPECIAL)
        .map(|id| (named.get(&id).cloned().unwrap_or_else(|| format!("<|reserved_token_{id}|>")), id))
        .collect())
}

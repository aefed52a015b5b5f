//! Text in and out of a model folder: its tokenizer, its chat template, and text decoded as tokens
//! arrive.
//!
//! | file | what | read by |
//! |---|---|---|
//! | `tokenizer.json` | a Hugging Face tokenizer (DeepSeek-V3's) | the `tokenizers` crate itself |
//! | `tiktoken.model` + `tokenizer_config.json` | Kimi's tiktoken BPE and special tokens | `tiktoken` |
//! | `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template` | the chat format | [`ChatTemplate`] (minijinja) |
//! | `generation_config.json`, else `config.json`: `eos_token_id` | where an answer ends | [`eos_token_ids`] |
//!
//! A folder with both tokenizer files uses `tokenizer.json`.
//!
//! ```
//! # let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text/kimi");
//! use kdtree_engine::text::{ChatTemplate, Message, Tokenizer};
//!
//! let tokenizer = Tokenizer::load(&dir)?;
//! let template = ChatTemplate::load(&dir)?.expect("the folder has a chat template");
//! let prompt = template.render(&[Message::user("Hello!")])?;
//! let ids = tokenizer.encode(&prompt, false)?;
//! let mut stream = tokenizer.stream();
//! let mut text = String::new();
//! for &id in &ids {
//!     text += &stream.push(id)?; // whole characters only, special tokens left out
//! }
//! assert!(text.ends_with("assistant"));
//! # Ok::<(), kdtree_engine::EngineError>(())
//! ```

mod answer;
mod chat;
mod stop;
mod stream;
mod tiktoken;

use std::path::Path;

pub use answer::{Finish, Stops, generate_text};
pub use chat::{ChatTemplate, Message};
pub(crate) use stop::StopText;
pub use stop::eos_token_ids;
pub use stream::TextStream;

use crate::error::{EngineError, Result};
use crate::model::json::read_capped;
use tiktoken::Tiktoken;

/// The most bytes a `tokenizer.json` may have (DeepSeek-V3's has 7.8 MB).
const MAX_TOKENIZER_BYTES: u64 = 256 << 20;
/// The most bytes a `tokenizer_config.json` or chat template may have.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A model folder's tokenizer.
pub struct Tokenizer {
    backend: Backend,
    /// The file it came from, for errors.
    file: String,
}

enum Backend {
    Hf(Box<tokenizers::Tokenizer>),
    Tiktoken(Box<Tiktoken>),
}

impl Tokenizer {
    /// The tokenizer of the model folder `dir`: `tokenizer.json`, else `tiktoken.model`.
    pub fn load(dir: &Path) -> Result<Self> {
        let json = dir.join("tokenizer.json");
        if json.exists() {
            let file = json.display().to_string();
            let text = read_capped(&json, "a tokenizer.json", MAX_TOKENIZER_BYTES)?;
            let hf = text
                .parse::<tokenizers::Tokenizer>()
                .map_err(|e| EngineError::Tokenizer { file: file.clone(), reason: e.to_string() })?;
            return Ok(Self { backend: Backend::Hf(Box::new(hf)), file });
        }
        let tiktoken = dir.join("tiktoken.model");
        if tiktoken.exists() {
            return Ok(Self {
                backend: Backend::Tiktoken(Box::new(Tiktoken::load(dir)?)),
                file: tiktoken.display().to_string(),
            });
        }
        Err(EngineError::Tokenizer {
            file: dir.display().to_string(),
            reason: "has neither tokenizer.json nor tiktoken.model".into(),
        })
    }

    /// The ids of `text`; special tokens written in it are recognised as such. `add_special` adds
    /// what the tokenizer adds to a bare text (tokenizer.json's post-processor, e.g. a BOS), as
    /// `tokenizer(text)` does in transformers; a rendered chat template has its own.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::Hf(hf) => {
                Ok(hf.encode(text, add_special).map_err(|e| self.error(e.to_string()))?.get_ids().to_vec())
            }
            Backend::Tiktoken(t) => t.encode(text),
        }
    }

    /// The text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut stream = self.stream_with_specials();
        let mut text = String::new();
        for &id in ids {
            text += &stream.push(id)?;
        }
        Ok(text + &stream.finish())
    }

    /// Decodes a generation token by token, whole characters at a time, special tokens left out.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream::new(self, false)
    }

    fn stream_with_specials(&self) -> TextStream<'_> {
        TextStream::new(self, true)
    }

    /// How many ids the tokenizer can produce; the model's vocabulary must hold them.
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Hf(hf) => hf.get_vocab_size(true),
            Backend::Tiktoken(t) => t.vocab_size(),
        }
    }

    /// The file the tokenizer came from.
    pub fn file(&self) -> &str {
        &self.file
    }

    fn error(&self, reason: String) -> EngineError {
        EngineError::Tokenizer { file: self.file.clone(), reason }
    }
}

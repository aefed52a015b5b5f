//! Text as tokens arrive. A token may end inside a character (a byte-level BPE splits an emoji or a
//! CJK character across tokens), so bytes are held back until they complete one: what is emitted
//! is always whole UTF-8, and the concatenation equals decoding all tokens at once.

use super::tiktoken::Tiktoken;
use super::{Backend, Tokenizer};
use crate::error::{EngineError, Result};

/// Decodes one generation's tokens a token at a time ([`Tokenizer::stream`]).
pub struct TextStream<'a> {
    /// The tokenizer's file, for errors.
    file: &'a str,
    state: State<'a>,
}

enum State<'a> {
    /// tokenizers' own streaming decoder, which handles its byte-fallback and byte-level decoders.
    Hf(Box<HfStream<'a>>),
    /// tiktoken ids are bytes: those of a character begun but not finished wait in `pending`.
    Tiktoken { tokenizer: &'a Tiktoken, pending: Vec<u8>, specials: bool },
}

type HfStream<'a> = tokenizers::DecodeStream<
    'a,
    tokenizers::ModelWrapper,
    tokenizers::NormalizerWrapper,
    tokenizers::PreTokenizerWrapper,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

impl<'a> TextStream<'a> {
    /// A stream of `tokenizer`'s ids; special tokens (end of turn, end of text) give text only with
    /// `specials`.
    pub(super) fn new(tokenizer: &'a Tokenizer, specials: bool) -> Self {
        let state = match &tokenizer.backend {
            Backend::Hf(hf) => State::Hf(Box::new(hf.decode_stream(!specials))),
            Backend::Tiktoken(t) => State::Tiktoken { tokenizer: t, pending: Vec::new(), specials },
        };
        Self { file: &tokenizer.file, state }
    }

    /// The text token `id` completes (empty while a character is unfinished, or for a special token).
    /// An id the tokenizer lacks (a model's vocabulary may be padded beyond it) has no text, as
    /// tokenizers decodes it.
    pub fn push(&mut self, id: u32) -> Result<String> {
        match &mut self.state {
            State::Hf(stream) => stream
                .step(id)
                .map(Option::unwrap_or_default)
                .map_err(|e| EngineError::Tokenizer { file: self.file.to_owned(), reason: e.to_string() }),
            State::Tiktoken { tokenizer, pending, specials } => {
                if let Some(bytes) = tokenizer.bytes(id).filter(|_| *specials || !tokenizer.is_special(id)) {
                    pending.extend_from_slice(bytes);
                }
                Ok(take_complete(pending))
            }
        }
    }

    /// What is left once the last token is in: an unfinished character, as U+FFFD.
    pub fn finish(self) -> String {
        match self.state {
            State::Tiktoken { pending, .. } => String::from_utf8_lossy(&pending).into_owned(),
            State::Hf(_) => String::new(),
        }
    }
}

/// The longest prefix of `pending` that is whole UTF-8 (bytes that can start no character become
/// U+FFFD), taken out of it; a character still unfinished at the end stays.
fn take_complete(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(pending) {
            Ok(text) => {
                out.push_str(text);
                pending.clear();
                return out;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(&String::from_utf8_lossy(&pending[..valid]));
                match e.error_len() {
                    // Unfinished at the end: wait for the next token's bytes.
                    None => {
                        pending.drain(..valid);
                        return out;
                    }
                    Some(bad) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        pending.drain(..valid + bad);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_split_across_tokens_wait_for_their_last_byte() {
        let rocket = "🚀".as_bytes();
        let mut pending = rocket[..2].to_vec();
        assert_eq!(take_complete(&mut pending), "");
        pending.extend_from_slice(&rocket[2..]);
        pending.extend_from_slice("a你".as_bytes());
        assert_eq!(take_complete(&mut pending), "🚀a你");
        assert!(pending.is_empty());
        pending.extend_from_slice(&[b'x', 0xff, b'y', 0xe4]);
        assert_eq!(take_complete(&mut pending), "x\u{fffd}y");
        assert_eq!(pending, [0xe4]);
    }
}

//! `generate`'s prompt: token ids as given, or text (`--prompt`, `--chat`) through the model
//! folder's tokenizer and chat template; and the ids that end the generation.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use kdtree_engine::Config;
use kdtree_engine::text::{ChatTemplate, Message, Tokenizer, eos_token_ids};

use super::generate::GenerateArgs;

/// The most bytes `--chat` may read (from a file or stdin).
const MAX_CHAT_BYTES: u64 = 64 << 20;

/// A request's prompt ids, with the tokenizer that made them (none for --prompt-ids).
pub struct Prompt {
    pub ids: Vec<u32>,
    pub tokenizer: Option<Tokenizer>,
    /// --stop's ids and, unless --ignore-eos, the model's end-of-sequence ids.
    pub stop_ids: Vec<u32>,
}

impl Prompt {
    pub fn read(args: &GenerateArgs, config: &Config) -> anyhow::Result<Self> {
        let dir = &args.model;
        let tokenizer = match (&args.prompt, &args.chat) {
            (None, None) => None,
            _ => Some(load_tokenizer(dir, config)?),
        };
        let ids = match (&args.prompt, &args.chat, &tokenizer) {
            (Some(text), _, Some(t)) => t.encode(text, true)?,
            (_, Some(chat), Some(t)) => {
                let template = ChatTemplate::load(dir)?.with_context(|| {
                    format!(
                        "--chat: {} has no chat template (chat_template.jinja, or `chat_template` in \
                         tokenizer_config.json): give the text with --prompt",
                        dir.display()
                    )
                })?;
                t.encode(&template.render(&read_chat(chat)?)?, false)?
            }
            _ => args.prompt_ids.clone(),
        };
        if ids.is_empty() {
            bail!("the prompt has no tokens: give some text");
        }
        let mut stop_ids = args.stop.clone();
        if !args.ignore_eos {
            stop_ids.extend(eos_token_ids(dir)?);
        }
        Ok(Self { ids, tokenizer, stop_ids })
    }
}

/// The folder's tokenizer, checked against the model's vocabulary.
fn load_tokenizer(dir: &Path, config: &Config) -> anyhow::Result<Tokenizer> {
    let tokenizer = Tokenizer::load(dir).context("--prompt and --chat need the model folder's tokenizer")?;
    if tokenizer.vocab_size() > config.vocab_size {
        bail!(
            "{}: the tokenizer has {} ids, more than the model's vocabulary of {} (`vocab_size` in config.json)",
            tokenizer.file(),
            tokenizer.vocab_size(),
            config.vocab_size
        );
    }
    Ok(tokenizer)
}

/// The messages of `--chat FILE`, or of stdin for `-`.
fn read_chat(path: &Path) -> anyhow::Result<Vec<Message>> {
    let (name, text) = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().take(MAX_CHAT_BYTES + 1).read_to_string(&mut text).context("--chat -: reading stdin")?;
        ("<stdin>".to_owned(), text)
    } else {
        let file = kdtree_quant::open_regular(path).with_context(|| format!("--chat {}", path.display()))?;
        let mut text = String::new();
        file.take(MAX_CHAT_BYTES + 1)
            .read_to_string(&mut text)
            .with_context(|| format!("--chat {}", path.display()))?;
        (path.display().to_string(), text)
    };
    if text.len() as u64 > MAX_CHAT_BYTES {
        bail!("--chat {name}: more than {MAX_CHAT_BYTES} bytes");
    }
    Ok(Message::parse_list(&name, &text)?)
}

//! Chat templates: the Jinja2 template a checkpoint ships (`chat_template.jinja`, else
//! `tokenizer_config.json`'s `chat_template`) rendered with minijinja as transformers renders it
//! (`trim_blocks` and `lstrip_blocks` on, Python's string methods through minijinja-contrib's
//! pycompat, `raise_exception`), with `bos_token` and `eos_token` from `tokenizer_config.json`.

use std::path::Path;

use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use super::MAX_CONFIG_BYTES;
use crate::error::{EngineError, Result};
use crate::model::json::read_capped;

/// One message of a conversation, as the OpenAI chat API writes it. `content` may be a string,
/// `null` (an assistant turn of tool calls only) or a list of parts, whose text parts are joined.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default, deserialize_with = "content")]
    pub content: String,
}

impl Message {
    pub fn user(content: &str) -> Self {
        Self { role: "user".into(), content: content.into() }
    }

    /// The messages of an OpenAI-style JSON text: an array of messages, or an object whose
    /// `messages` is one (a chat completion request). `file` names it in errors.
    pub fn parse_list(file: &str, json: &str) -> Result<Vec<Message>> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Chat {
            List(Vec<Message>),
            Request { messages: Vec<Message> },
        }
        let bad = |reason: String| EngineError::Config { file: file.into(), key: "messages".into(), reason };
        let chat: Chat = serde_json::from_str(json).map_err(|e| {
            bad(format!("{e}: expected an array of {{\"role\", \"content\"}} messages, or an object with `messages`"))
        })?;
        let (Chat::List(messages) | Chat::Request { messages }) = chat;
        if messages.is_empty() {
            return Err(bad("is empty: a chat needs at least one message".into()));
        }
        Ok(messages)
    }
}

/// A message's `content`: a string, `null`, or text parts (`{"type": "text", "text": ...}`).
fn content<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        text: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
    }
    match Option::<Content>::deserialize(d)? {
        None => Ok(String::new()),
        Some(Content::Text(text)) => Ok(text),
        Some(Content::Parts(parts)) => parts
            .into_iter()
            .map(|p| match (p.kind.as_str(), p.text) {
                ("text", Some(text)) => Ok(text),
                (kind, _) => Err(serde::de::Error::custom(format!("a `{kind}` part: only text parts are supported"))),
            })
            .collect(),
    }
}

/// A checkpoint's chat template.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    /// Where it came from, for errors.
    file: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// The keys of `tokenizer_config.json` a chat needs.
#[derive(Deserialize)]
struct TokenizerConfig {
    chat_template: Option<Templates>,
    bos_token: Option<Token>,
    eos_token: Option<Token>,
}

/// One template, or several by name (transformers' list form), of which `default` is the chat's.
#[derive(Deserialize)]
#[serde(untagged)]
enum Templates {
    One(String),
    Named(Vec<Named>),
}

#[derive(Deserialize)]
struct Named {
    name: String,
    template: String,
}

/// A special token as `tokenizer_config.json` writes it: its text, or an `AddedToken` object.
#[derive(Deserialize)]
#[serde(untagged)]
enum Token {
    Text(String),
    Added { content: String },
}

impl Token {
    fn text(self) -> String {
        match self {
            Token::Text(text) | Token::Added { content: text } => text,
        }
    }
}

impl ChatTemplate {
    /// The chat template of the model folder `dir`; `None` when it has none.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let config_path = dir.join("tokenizer_config.json");
        let config_file = config_path.display().to_string();
        let config = if config_path.exists() {
            let text = read_capped(&config_path, "a tokenizer_config.json", MAX_CONFIG_BYTES)?;
            let config: TokenizerConfig = serde_json::from_str(&text).map_err(|e| EngineError::Config {
                file: config_file.clone(),
                key: "chat_template/bos_token/eos_token".into(),
                reason: e.to_string(),
            })?;
            Some(config)
        } else {
            None
        };
        let (bos_token, eos_token, from_config) = match config {
            Some(c) => (c.bos_token.map(Token::text), c.eos_token.map(Token::text), c.chat_template),
            None => (None, None, None),
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, file) = if jinja.exists() {
            (read_capped(&jinja, "a chat template", MAX_CONFIG_BYTES)?, jinja.display().to_string())
        } else {
            let file = format!("{config_file} (`chat_template`)");
            match from_config {
                None => return Ok(None),
                Some(Templates::One(source)) => (source, file),
                Some(Templates::Named(named)) => match named.into_iter().find(|t| t.name == "default") {
                    Some(t) => (t.template, file),
                    None => {
                        let reason = "lists named templates but none named `default`".into();
                        return Err(EngineError::ChatTemplate { file, reason });
                    }
                },
            }
        };
        let template = Self { source, file, bos_token, eos_token };
        // A syntax error is the folder's fault: say so at load, not at the first chat.
        template.environment().template_from_str(&template.source).map_err(|e| template.error(e))?;
        Ok(Some(template))
    }

    /// The prompt of `messages`, ending where the assistant's answer begins.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        let context = minijinja::context! {
            messages => minijinja::value::Serde(messages),
            add_generation_prompt => true,
            bos_token => self.bos_token.as_deref().unwrap_or(""),
            eos_token => self.eos_token.as_deref().unwrap_or(""),
        };
        self.environment().render_str(&self.source, context).map_err(|e| self.error(e))
    }

    /// What transformers' template environment offers.
    fn environment(&self) -> Environment<'static> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        env.set_syntax(syntax.expect("the default delimiters are valid"));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env
    }

    fn error(&self, e: minijinja::Error) -> EngineError {
        // minijinja's Display leaves out the cause chain's detail; its alternate form has it.
        EngineError::ChatTemplate { file: self.file.clone(), reason: format!("{e:#}") }
    }
}

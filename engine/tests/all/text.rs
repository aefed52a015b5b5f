//! Tokenizers and chat templates against the reference libraries: the fixtures under
//! `fixtures/text/` and the ids, texts and rendered chats in `expected.json` were made by
//! `fixtures/text/make_fixtures.py` with Python's `tokenizers`, `tiktoken` and `jinja2`.

use std::path::{Path, PathBuf};

use kdtree_engine::EngineError;
use kdtree_engine::text::{ChatTemplate, Message, Tokenizer};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text")
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as u32).collect()
}

/// Ids and decoded text equal the reference library's for every fixed string; streamed one token
/// at a time, the text is the same, whole characters at every step.
fn matches_reference(kind: &str) {
    let expected = &expected()[kind];
    let tokenizer = Tokenizer::load(&fixtures().join(kind)).unwrap();
    assert_eq!(tokenizer.vocab_size(), expected["vocab"].as_u64().unwrap() as usize);
    let strings = expected["strings"].as_array().unwrap();
    for (i, text) in strings.iter().enumerate() {
        let text = text.as_str().unwrap();
        let want = ids(&expected["ids"][i]);
        let got = tokenizer.encode(text, false).unwrap();
        assert_eq!(got, want, "{kind}: {text:?}");
        assert_eq!(tokenizer.decode(&got).unwrap(), expected["decoded"][i].as_str().unwrap(), "{kind}: {text:?}");
        if i + 1 < strings.len() {
            // The last string is all special tokens, which a stream leaves out.
            let mut stream = tokenizer.stream();
            let streamed: String = got.iter().map(|&id| stream.push(id).unwrap()).collect();
            assert_eq!(streamed + &stream.finish(), text, "{kind}: streamed");
        }
    }
}

#[test]
fn tokenizer_json_ids_equal_hugging_face_tokenizers() {
    matches_reference("deepseek");
}

#[test]
fn tiktoken_model_ids_equal_tiktoken_with_kimis_pattern_and_special_tokens() {
    matches_reference("kimi");
}

/// The chat template renders as jinja2 renders it in transformers, and tokenizes to the same ids:
/// from tokenizer_config.json (DeepSeek's, with namespace, `trim` and Python's `.split()`) and from
/// chat_template.jinja (Kimi's).
#[test]
fn chat_templates_render_as_transformers_does() {
    let expected = expected();
    let messages: Vec<Message> = serde_json::from_value(expected["messages"].clone()).unwrap();
    for kind in ["deepseek", "kimi"] {
        let dir = fixtures().join(kind);
        let template = ChatTemplate::load(&dir).unwrap().unwrap();
        let chat = template.render(&messages).unwrap();
        assert_eq!(chat, expected[kind]["chat"].as_str().unwrap(), "{kind}");
        let tokenizer = Tokenizer::load(&dir).unwrap();
        assert_eq!(tokenizer.encode(&chat, false).unwrap(), ids(&expected[kind]["chat_ids"]), "{kind}");
    }
}

#[test]
fn openai_messages_are_read_from_a_list_or_a_request_with_text_parts() {
    let list = r#"[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                   {"role": "assistant", "content": null}]"#;
    let messages = Message::parse_list("chat.json", list).unwrap();
    assert_eq!(messages, [Message::user("ab"), Message { role: "assistant".into(), content: String::new() }]);
    let request = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
    assert_eq!(Message::parse_list("chat.json", request).unwrap(), [Message::user("hi")]);
    for (bad, says) in [
        ("[]", "is empty"),
        (r#"{"prompt": "hi"}"#, "expected an array"),
        (r#"[{"role": "user", "content": [{"type": "image_url"}]}]"#, "expected an array"),
    ] {
        let e = Message::parse_list("chat.json", bad).unwrap_err().to_string();
        assert!(e.contains("chat.json") && e.contains(says), "{bad}: {e}");
    }
}

/// Copies the fixture folder `kind` to a temporary folder, where `edit` changes it.
fn edited(kind: &str, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join(kind)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    edit(dir.path());
    dir
}

#[test]
fn bad_tokenizer_and_template_files_are_errors_naming_the_file() {
    let empty = tempfile::tempdir().unwrap();
    let e = Tokenizer::load(empty.path()).err().unwrap().to_string();
    assert!(e.contains("has neither tokenizer.json nor tiktoken.model"), "{e}");
    assert!(ChatTemplate::load(empty.path()).unwrap().is_none());

    let dir = edited("kimi", |d| {
        let ranks = std::fs::read_to_string(d.join("tiktoken.model")).unwrap();
        std::fs::write(d.join("tiktoken.model"), ranks.replacen(' ', " x", 1)).unwrap();
    });
    let e = Tokenizer::load(dir.path()).err().unwrap();
    assert!(matches!(&e, EngineError::Tokenizer { file, .. } if file.ends_with("tiktoken.model:1")), "{e}");
    let dir = edited("kimi", |d| {
        let ranks = std::fs::read_to_string(d.join("tiktoken.model")).unwrap();
        let first = ranks.lines().next().unwrap().to_owned();
        std::fs::write(d.join("tiktoken.model"), format!("{ranks}{first}\n")).unwrap();
    });
    let e = Tokenizer::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("repeats rank 0"), "{e}");

    let dir = edited("kimi", |d| std::fs::write(d.join("chat_template.jinja"), "{% for m in messages %}").unwrap());
    let e = ChatTemplate::load(dir.path()).unwrap_err();
    assert!(matches!(&e, EngineError::ChatTemplate { file, .. } if file.ends_with("chat_template.jinja")), "{e}");
    let dir = edited("kimi", |d| {
        std::fs::write(d.join("chat_template.jinja"), "{{ raise_exception('roles must alternate') }}").unwrap()
    });
    let e = ChatTemplate::load(dir.path()).unwrap().unwrap().render(&[Message::user("a")]).unwrap_err().to_string();
    assert!(e.contains("roles must alternate"), "{e}");
    let dir = edited("deepseek", |d| std::fs::write(d.join("tokenizer.json"), "{}").unwrap());
    let e = Tokenizer::load(dir.path()).err().unwrap();
    assert!(matches!(&e, EngineError::Tokenizer { file, .. } if file.ends_with("tokenizer.json")), "{e}");
}

/// A tiny model whose vocabulary is the `kind` fixture tokenizer's, with that tokenizer and chat
/// template in its folder.
fn text_model(kind: &str) -> tempfile::TempDir {
    use kdtree_engine::tiny::{TinySpec, write_tiny_model};
    let vocab = expected()[kind]["vocab"].as_u64().unwrap() as usize;
    let dir = edited(kind, |_| {});
    write_tiny_model(dir.path(), &TinySpec { vocab_size: vocab, ..TinySpec::default() }).unwrap();
    dir
}

/// `kdtree-engine generate` on `model` with `args` and `stdin`; stdout and stderr as text.
fn generate(model: &Path, args: &[&str], stdin: &str) -> (String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["generate", "--backend", "cpu", "--model", model.to_str().unwrap()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{args:?}: {stderr}");
    (stdout, stderr)
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap()
}

/// `generate --prompt` and `--chat` (a file, and stdin) on a tiny model with each tokenizer: the
/// prompt is the tokenizer's (and template's) ids, stdout is the answer's text alone, streamed,
/// the same as --json's `text`, which is the stream decoding of its tokens.
#[test]
fn generate_answers_a_prompt_and_a_chat_in_text() {
    let messages = r#"[{"role": "user", "content": "What is 2 + 2? 你好 🚀"}]"#;
    for kind in ["deepseek", "kimi"] {
        let model = text_model(kind);
        let dir = model.path();
        let tokenizer = Tokenizer::load(dir).unwrap();
        let chat_file = dir.join("chat.json");
        std::fs::write(&chat_file, messages).unwrap();
        let chat = chat_file.to_str().unwrap();
        for (prompt, stdin) in
            [(vec!["--prompt", "Hello, 世界 🚀"], ""), (vec!["--chat", chat], ""), (vec!["--chat", "-"], messages)]
        {
            let args = [&prompt[..], &["--max-new", "12", "--ignore-eos"]].concat();
            let (text, stderr) = generate(dir, &args, stdin);
            assert!(stderr.contains("decode"), "{stderr}");
            let out = json(&generate(dir, &[&args[..], &["--json"]].concat(), stdin).0);
            assert_eq!(out["text"].as_str().unwrap().to_owned() + "\n", text, "{kind} {prompt:?}");
            let tokens = ids(&out["tokens"]);
            assert_eq!(tokens.len(), 12);
            let mut stream = tokenizer.stream();
            let decoded: String = tokens.iter().map(|&t| stream.push(t).unwrap()).collect();
            assert_eq!(decoded + &stream.finish(), out["text"].as_str().unwrap());
            let want = match prompt[0] {
                "--prompt" => tokenizer.encode("Hello, 世界 🚀", true).unwrap(),
                _ => {
                    let template = ChatTemplate::load(dir).unwrap().unwrap();
                    let messages = Message::parse_list("chat", messages).unwrap();
                    tokenizer.encode(&template.render(&messages).unwrap(), false).unwrap()
                }
            };
            assert_eq!(ids(&out["prompt"]), want, "{kind} {prompt:?}");
        }
    }
}

/// The model's end-of-sequence id (generation_config.json, else config.json) ends the answer
/// unless --ignore-eos; --stop ids do too; --stop-text cuts the text before the string.
#[test]
fn generation_stops_at_eos_stop_ids_and_stop_strings() {
    let model = text_model("kimi");
    let dir = model.path();
    let run = |extra: &[&str]| {
        json(&generate(dir, &[&["--prompt", "Hello", "--max-new", "12", "--json"], extra].concat(), "").0)
    };
    let free = run(&["--ignore-eos"]);
    let tokens = ids(&free["tokens"]);
    // The fourth token as the end of sequence, first from config.json, then generation_config.json.
    let eos = tokens[3];
    let first = tokens.iter().position(|&t| t == eos).unwrap();
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["eos_token_id"] = eos.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    assert_eq!(ids(&run(&[])["tokens"]), tokens[..=first]);
    std::fs::write(dir.join("generation_config.json"), format!(r#"{{"eos_token_id": [99999, {eos}]}}"#)).unwrap();
    assert_eq!(ids(&run(&[])["tokens"]), tokens[..=first]);
    assert_eq!(ids(&run(&["--ignore-eos"])["tokens"]), tokens);
    assert_eq!(
        ids(&run(&["--ignore-eos", "--stop", &tokens[1].to_string()])["tokens"]),
        tokens[..=tokens.iter().position(|&t| t == tokens[1]).unwrap()]
    );
    // A stop string: the text ends where it first begins.
    let text = free["text"].as_str().unwrap();
    let cut = text.char_indices().nth(text.chars().count() / 2).map_or(0, |(i, _)| i);
    let stop: String = text[cut..].chars().take(2).collect();
    let (stdout, _) =
        generate(dir, &["--prompt", "Hello", "--max-new", "12", "--ignore-eos", "--stop-text", &stop], "");
    assert_eq!(stdout, format!("{}\n", &text[..text.find(&stop).unwrap()]));
}

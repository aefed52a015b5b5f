//! `kdtree-engine serve` on a tiny model with a tokenizer fixture, talked to over HTTP by a real
//! client: completions and chat completions, whole and streamed, the models list, health, and
//! the errors a bad request gets.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use serde_json::{Value, json};

/// The server on a tiny model with Kimi's tokenizer fixture, and its base URL; killed on drop.
struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Server {
    start_with(TinySpec::default(), extra)
}

/// [`start`] with the model of `spec`.
fn start_with(spec: TinySpec, extra: &[&str]) -> Server {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text/kimi");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    // The fixture tokenizer's 676 ids.
    write_tiny_model(dir.path(), &TinySpec { vocab_size: 676, ..spec }).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["serve", "--backend", "cpu", "--port", "0", "--served-model-name", "tiny"])
        .args(["--model", dir.path().to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("said {line:?}")).to_owned();
    Server { child, url, _dir: dir }
}

fn agent() -> ureq::Agent {
    // Error statuses are answers to read here, not failures of the call.
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// POSTs `body` (raw text) to `path`; the status and the JSON answer.
fn post(server: &Server, path: &str, body: &str) -> (u16, Value) {
    let mut response =
        agent().post(&format!("{}{path}", server.url)).header("content-type", "application/json").send(body).unwrap();
    let status = response.status().as_u16();
    (status, response.body_mut().read_json().unwrap())
}

/// The data lines of a streamed answer to `body`.
fn post_stream(server: &Server, path: &str, body: &Value) -> Vec<String> {
    let mut response = agent().post(&format!("{}{path}", server.url)).send_json(body).unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut text = String::new();
    response.body_mut().as_reader().read_to_string(&mut text).unwrap();
    text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
}

#[test]
fn completions_and_chat_answer_whole_and_streamed_with_usage() {
    let server = start(&[]);
    let mut health = agent().get(&format!("{}/health", server.url)).call().unwrap();
    assert_eq!(health.body_mut().read_json::<Value>().unwrap()["status"], "ok");
    let mut models = agent().get(&format!("{}/v1/models", server.url)).call().unwrap();
    assert_eq!(models.body_mut().read_json::<Value>().unwrap()["data"][0]["id"], "tiny");

    let request = json!({"model": "tiny", "prompt": "Hello, 世界", "max_tokens": 6, "ignore_eos": true});
    let (status, whole) = post(&server, "/v1/completions", &request.to_string());
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 6);
    assert_eq!(whole["usage"]["total_tokens"], whole["usage"]["prompt_tokens"].as_u64().unwrap() + 6);
    // Streamed: the same text in pieces, a last chunk with the finish reason and usage, then [DONE].
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let lines = post_stream(&server, "/v1/completions", &streamed);
    assert_eq!(lines.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = lines[..lines.len() - 1].iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let text: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    assert_eq!(chunks.last().unwrap()["usage"], whole["usage"]);

    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hi 🚀"}], "max_tokens": 5});
    let (status, answer) = post(&server, "/v1/chat/completions", &chat.to_string());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["choices"][0]["message"]["role"], "assistant");
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let lines = post_stream(&server, "/v1/chat/completions", &streamed);
    let deltas: String = lines[..lines.len() - 1]
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(deltas, content);
}

#[test]
fn bad_requests_get_json_errors_and_the_server_keeps_serving() {
    let server = start(&[]);
    let cases = [
        ("/v1/completions", "{not json", 400, "not a valid request"),
        ("/v1/completions", r#"{"max_tokens": 3}"#, 400, "prompt"),
        ("/v1/completions", r#"{"model": "gpt-4", "prompt": "hi"}"#, 404, "`gpt-4` does not exist"),
        ("/v1/completions", r#"{"prompt": "hi", "max_tokens": 100000}"#, 400, "context"),
        ("/v1/completions", r#"{"prompt": [1, 99999]}"#, 400, "outside the vocabulary"),
        ("/v1/completions", r#"{"prompt": "hi", "max_tokens": 0}"#, 400, "at least 1"),
        ("/v1/chat/completions", r#"{"messages": []}"#, 400, "empty"),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            400,
            "valid request",
        ),
    ];
    for (path, body, status, says) in cases {
        let (got, answer) = post(&server, path, body);
        assert_eq!(got, status, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    let (status, _) = post(&server, "/v1/completions", r#"{"prompt": "hi", "max_tokens": 2}"#);
    assert_eq!(status, 200);
}

/// With no room to wait, a request that comes while another is generated is refused with 503;
/// a streaming client that goes away stops its generation, so the next request is served.
#[test]
fn a_full_queue_answers_503_and_a_client_that_leaves_frees_the_model() {
    // Wider and longer than the tiny default, so that the first request is still generating when
    // the second comes.
    let spec =
        TinySpec { hidden_size: 512, intermediate_size: 1024, max_position_embeddings: 4096, ..TinySpec::default() };
    let server = start_with(spec, &["--max-queue", "0"]);
    let long = json!({"prompt": "Hello", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    // A streaming request that is read a little, then dropped.
    let mut first = agent().post(&format!("{}/v1/completions", server.url)).send_json(&long).unwrap();
    let mut reader = BufReader::new(first.body_mut().as_reader());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("data: "), "{line}");
    let (status, answer) = post(&server, "/v1/completions", r#"{"prompt": "hi", "max_tokens": 2}"#);
    assert_eq!(status, 503, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("retry later"), "{answer}");
    drop(reader);
    drop(first);
    // The generation notices at its next token; then the model is free again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (status, _) = post(&server, "/v1/completions", r#"{"prompt": "hi", "max_tokens": 2}"#);
        if status == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the dropped request still holds the model");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// With --spec, answers come through speculative decoding: the same text as plain greedy decoding.
#[test]
fn a_speculative_server_answers_as_the_greedy_one() {
    let request = json!({"prompt": "Hello, 世界", "max_tokens": 24, "ignore_eos": true}).to_string();
    let (status, greedy) = post(&start(&[]), "/v1/completions", &request);
    assert_eq!(status, 200, "{greedy}");
    for spec in
        [&["--spec", "ddtree", "--budget", "8", "--draft-len", "4"][..], &["--spec", "chain", "--drafter", "model"]]
    {
        let (status, answer) = post(&start(spec), "/v1/completions", &request);
        assert_eq!(status, 200, "{spec:?}: {answer}");
        assert_eq!(answer["choices"], greedy["choices"], "{spec:?}");
        assert_eq!(answer["usage"], greedy["usage"], "{spec:?}");
    }
}

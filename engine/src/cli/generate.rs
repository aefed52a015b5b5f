use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use std::sync::Arc;

use kdtree_engine::bench::peak_rss;
use kdtree_engine::cpu::CpuBackend;
use kdtree_engine::generate::rate;
use kdtree_engine::registry::Backend;
use kdtree_engine::spec::SpecArgs;
use kdtree_engine::table::table;
use kdtree_engine::text::{Stops, Tokenizer, generate_text};
use kdtree_engine::{Config, EngineError, Generation, Model, greedy_generate_timed};

use super::backend::{BackendArgs, variant_table};
use super::emit;
use super::prompt::Prompt;

/// Greedy decoding of a text prompt, a chat, or token ids.
///
/// Text (--prompt, --chat) goes through the model folder's tokenizer: tokenizer.json (Hugging Face
/// tokenizers, DeepSeek-V3's) or tiktoken.model with tokenizer_config.json's special tokens (Kimi's).
/// A chat is rendered with the folder's chat template (chat_template.jinja, else tokenizer_config.json's
/// `chat_template`) up to the assistant's turn. The answer's text streams to stdout as it is decoded,
/// whole characters at a time; the speed (prefill and decode separately) goes to stderr. With
/// --prompt-ids, stdout gets the new token ids and the speed table.
///
/// Generation stops after --max-new tokens, at the model's end-of-sequence ids (`eos_token_id` of
/// generation_config.json, else config.json; not with --ignore-eos), at a --stop id, or where the
/// text contains a --stop-text string.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model folder: config.json and safetensors shards (and, for text, the tokenizer files).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt token ids, comma-separated (e.g. 1,2,3).
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present_any = ["prompt", "chat"],
        conflicts_with_all = ["prompt", "chat"]
    )]
    pub prompt_ids: Vec<u32>,
    /// Prompt text, tokenized as it is (special tokens written in it count as such; no chat template).
    #[arg(long, value_name = "TEXT", conflicts_with = "chat")]
    pub prompt: Option<String>,
    /// A chat to answer: an OpenAI-style messages JSON file (an array of {"role", "content"}, or a
    /// request object with "messages"), `-` for stdin.
    #[arg(long, value_name = "FILE|-")]
    pub chat: Option<PathBuf>,
    /// Most new tokens to generate, at least 1; the prompt and these must fit the model's context
    /// (`max_position_embeddings` in config.json).
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub max_new: usize,
    /// Stop after generating any of these token ids (comma-separated or repeated; ids of the
    /// vocabulary). The id is kept among the tokens.
    #[arg(long, value_delimiter = ',', value_name = "ID")]
    pub stop: Vec<u32>,
    /// Stop where the answer's text contains this string (repeatable); the text ends before it.
    /// Needs a text prompt (--prompt or --chat) and plain greedy decoding (not --spec).
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["prompt_ids", "spec"])]
    pub stop_text: Vec<String>,
    /// Do not stop at the model's end-of-sequence ids: always generate --max-new tokens (for
    /// benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("0 new tokens generate nothing: give at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Checks the request against the model's config.json before any weight is loaded: token ids in the
/// vocabulary, the prompt and `--max-new` within the context, the speculative options.
fn check(args: &GenerateArgs, config: &Config, prompt: &Prompt) -> kdtree_engine::Result<()> {
    let vocab = config.vocab_size;
    let outside = |what: &str, id: u32| EngineError::ArgumentOutOfRange {
        what: what.into(),
        value: id.into(),
        limit: format!("outside the vocabulary of {vocab} (`vocab_size` in config.json)"),
    };
    if let Some(&id) = prompt.ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(outside("a --prompt-ids token", id));
    }
    if let Some(&id) = args.stop.iter().find(|&&id| id as usize >= vocab) {
        return Err(outside("--stop", id));
    }
    config.check_context(prompt.ids.len(), args.max_new)?;
    if args.spec.spec.is_some() {
        args.spec.check(config, prompt.ids.len(), args.max_new)?;
    }
    Ok(())
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let config_path = args.model.join("config.json");
    let config = Config::load(&config_path).with_context(|| format!("reading {}", config_path.display()))?;
    let prompt = Prompt::read(&args, &config).with_context(|| format!("generate with {}", args.model.display()))?;
    check(&args, &config, &prompt).with_context(|| format!("generate with {}", args.model.display()))?;
    // Exact mode's variants are tuned for the M the decode loop runs most: the tree, or one token.
    let default_m = args.spec.largest_forward();
    match args.backend.open(&args.model, default_m)? {
        None => run_on(&args, &prompt, Arc::new(CpuBackend), |_| (String::new(), serde_json::json!([]))),
        Some(cuda) => run_on(&args, &prompt, Arc::new(cuda), |model| variant_table(model.backend())),
    }
}

/// Loads the model on `backend` and generates; `variants` describes the kernels it chose.
fn run_on<B: Backend>(
    args: &GenerateArgs,
    prompt: &Prompt,
    backend: Arc<B>,
    variants: impl Fn(&Model<B>) -> (String, serde_json::Value),
) -> anyhow::Result<()> {
    let rss_before_load = peak_rss();
    let mut model = args.backend.load(&args.model, backend)?;
    let kv = args.backend.configure(&mut model)?;
    eprintln!("{kv}");
    let (variants, variants_json) = variants(&model);
    // Text streams to stdout, and ids with --json make one JSON object there: the table goes to stderr.
    let streaming = prompt.tokenizer.is_some() && !args.json && args.spec.spec.is_none();
    if args.json || streaming {
        eprint!("{variants}");
    } else {
        emit(&variants)?;
    }
    if args.spec.spec.is_some() {
        let c = args.spec.run(&model, &prompt.ids, args.max_new, &prompt.stop_ids)?;
        let text = if args.json { serde_json::to_string(&c)? } else { c.table() };
        return emit(&format!("{text}\n"));
    }
    let (g, text) = match (&prompt.tokenizer, streaming) {
        (Some(tokenizer), true) => {
            let g = stream_text(&model, prompt, tokenizer, &args.stop_text, args.max_new, &mut std::io::stdout())?;
            emit("\n")?;
            (g, None)
        }
        (Some(tokenizer), false) => {
            let mut text = Vec::new();
            let g = stream_text(&model, prompt, tokenizer, &args.stop_text, args.max_new, &mut text)?;
            (g, Some(String::from_utf8(text)?))
        }
        (None, _) => (greedy_generate_timed(&model, &prompt.ids, args.max_new, &prompt.stop_ids)?, None),
    };
    let prefill_s = g.prefill.as_secs_f64();
    let decode_s = g.decode.as_secs_f64();
    let decoded = g.decoded();
    let prefill_tps = rate(prompt.ids.len(), prefill_s);
    let decode_tps = g.decode_tokens_per_s();
    if args.json {
        let out = serde_json::json!({
            "model": args.model, "prompt": prompt.ids, "tokens": g.tokens, "text": text,
            "backend": model.backend().describe(), "dtype": model.dtypes(), "kv_dtype": model.heads().kv,
            "w4a16_variants": variants_json,
            "prefill_s": prefill_s, "decode_s": decode_s,
            "prefill_tokens_per_s": prefill_tps, "decode_tokens_per_s": decode_tps,
            "peak_rss_before_load_bytes": rss_before_load, "peak_rss_bytes": peak_rss(),
        });
        return emit(&format!("{out}\n"));
    }
    let mut t = table(&["phase", "tokens", "seconds", "tokens/s"], &[1, 2, 3]);
    for (phase, tokens, seconds, tps) in
        [("prefill", prompt.ids.len(), prefill_s, prefill_tps), ("decode", decoded, decode_s, decode_tps)]
    {
        t.add_row(vec![phase.to_owned(), tokens.to_string(), format!("{seconds:.6}"), format!("{tps:.1}")]);
    }
    if streaming {
        eprintln!("{t}");
        return Ok(());
    }
    let ids: Vec<String> = g.tokens.iter().map(u32::to_string).collect();
    emit(&format!("tokens: {}\n{t}\n", ids.join(",")))
}

/// Greedy decoding of `prompt` whose answer's text is written to `out` as it is decoded (flushed a
/// token at a time).
fn stream_text<B: Backend>(
    model: &Model<B>,
    prompt: &Prompt,
    tokenizer: &Tokenizer,
    stop_text: &[String],
    max_new: usize,
    out: &mut dyn Write,
) -> anyhow::Result<Generation> {
    let stops = Stops { ids: prompt.stop_ids.clone(), texts: stop_text.to_vec() };
    let (g, _) = generate_text(model, tokenizer, &prompt.ids, max_new, &stops, None, |text| {
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|source| EngineError::Io { file: "stdout".into(), source })?;
        Ok(true)
    })?;
    Ok(g)
}

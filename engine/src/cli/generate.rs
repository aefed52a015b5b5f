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
use kdtree_engine::{Config, EngineError, Model, greedy_generate_timed};

use super::backend::{BackendArgs, variant_table};
use super::emit;

/// Greedy decoding from token ids: the prompt is prefilled in chunks (--prefill-chunk), then one
/// token per forward. Prints the new tokens and the speed, prefill and decode separately.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model folder: config.json and safetensors shards.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt token ids, comma-separated (e.g. 1,2,3).
    #[arg(long, value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    /// Most new tokens to generate, at least 1; the prompt and these must fit the model's context
    /// (`max_position_embeddings` in config.json).
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub max_new: usize,
    /// Stop after generating this token id (one of the vocabulary).
    #[arg(long)]
    pub stop: Option<u32>,
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
fn check(args: &GenerateArgs, config: &Config) -> kdtree_engine::Result<()> {
    let vocab = config.vocab_size;
    let outside = |what: &str, id: u32| EngineError::ArgumentOutOfRange {
        what: what.into(),
        value: id.into(),
        limit: format!("outside the vocabulary of {vocab} (`vocab_size` in config.json)"),
    };
    if let Some(&id) = args.prompt_ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(outside("a --prompt-ids token", id));
    }
    if let Some(id) = args.stop.filter(|&id| id as usize >= vocab) {
        return Err(outside("--stop", id));
    }
    config.check_context(args.prompt_ids.len(), args.max_new)?;
    if args.spec.spec.is_some() {
        args.spec.check(config, args.prompt_ids.len(), args.max_new)?;
    }
    Ok(())
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let config_path = args.model.join("config.json");
    let config = Config::load(&config_path).with_context(|| format!("reading {}", config_path.display()))?;
    check(&args, &config).with_context(|| format!("generate with {}", args.model.display()))?;
    // Exact mode's variants are tuned for the M the decode loop runs most: the tree, or one token.
    let default_m = args.spec.largest_forward();
    match args.backend.open(&args.model, default_m)? {
        None => run_on(&args, Arc::new(CpuBackend), |_| (String::new(), serde_json::json!([]))),
        Some(cuda) => run_on(&args, Arc::new(cuda), |model| variant_table(model.backend())),
    }
}

/// Loads the model on `backend` and generates; `variants` describes the kernels it chose.
fn run_on<B: Backend>(
    args: &GenerateArgs,
    backend: Arc<B>,
    variants: impl Fn(&Model<B>) -> (String, serde_json::Value),
) -> anyhow::Result<()> {
    let rss_before_load = peak_rss();
    let mut model =
        Model::load_on(&args.model, backend).with_context(|| format!("loading {}", args.model.display()))?;
    let kv = args.backend.configure(&mut model)?;
    eprintln!("{kv}");
    let (variants, variants_json) = variants(&model);
    // With --json, stdout holds one JSON object: the table goes to stderr (and into the object).
    if args.json {
        eprint!("{variants}");
    } else {
        emit(&variants)?;
    }
    if args.spec.spec.is_some() {
        let c = args.spec.run(&model, &args.prompt_ids, args.max_new, args.stop)?;
        let text = if args.json { serde_json::to_string(&c)? } else { c.table() };
        return emit(&format!("{text}\n"));
    }
    let g = greedy_generate_timed(&model, &args.prompt_ids, args.max_new, args.stop)?;
    let prefill_s = g.prefill.as_secs_f64();
    let decode_s = g.decode.as_secs_f64();
    let decoded = g.decoded();
    let prefill_tps = rate(args.prompt_ids.len(), prefill_s);
    let decode_tps = g.decode_tokens_per_s();
    if args.json {
        let out = serde_json::json!({
            "model": args.model, "prompt": args.prompt_ids, "tokens": g.tokens, "backend": model.backend().describe(),
            "w4a16_variants": variants_json,
            "prefill_s": prefill_s, "decode_s": decode_s,
            "prefill_tokens_per_s": prefill_tps, "decode_tokens_per_s": decode_tps,
            "peak_rss_before_load_bytes": rss_before_load, "peak_rss_bytes": peak_rss(),
        });
        emit(&format!("{out}\n"))
    } else {
        let ids: Vec<String> = g.tokens.iter().map(u32::to_string).collect();
        let mut t = table(&["phase", "tokens", "seconds", "tokens/s"], &[1, 2, 3]);
        for (phase, tokens, seconds, tps) in
            [("prefill", args.prompt_ids.len(), prefill_s, prefill_tps), ("decode", decoded, decode_s, decode_tps)]
        {
            t.add_row(vec![phase.to_owned(), tokens.to_string(), format!("{seconds:.6}"), format!("{tps:.1}")]);
        }
        emit(&format!("tokens: {}\n{t}\n", ids.join(",")))
    }
}

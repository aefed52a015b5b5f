use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use kdtree_engine::Config;
use kdtree_engine::bench::{ContextRow, ForwardRow, ReadBytes, context_table, peak_rss, sweep, table};
use kdtree_engine::generate::rate;
use kdtree_engine::registry::{Backend, KvStore};
use kdtree_engine::spec::{CostModel, DflashConfig, DflashDrafter, DflashModel, Drafter, round, sweep as spec_sweep};
use kdtree_jit::tune::bench::Timing;
use kdtree_jit::tune::clock::{Clock, CudaClock};
use kdtree_jit::tune::peers::copy_bandwidth;
use kdtree_quant::sample::Uniform;

use super::backend::{BackendArgs, variant_table};
use super::emit;

/// Time the model's forward on the GPU at T = 1, 2, 3, 4, 6, 8, ... tokens after each context, against
/// its bandwidth floor.
///
/// Per context of --context (a list) random tokens: the prompt is prefilled (chunked, timed), then
/// each T runs a causal chain of T new tokens (what a DDTree of depth T costs at most) --reps times,
/// timed with CUDA events; a rep ends when the argmax ids are on the host. Per T it reports the
/// bytes the forward must read (dense weights and LM head once, each routed expert some token routes
/// to once per MoE layer, the latent KV entries once), the floor they set at the device-to-device
/// copy bandwidth measured in this run, % of that floor, attention's share, the distinct experts per
/// MoE layer, and the time by op class of one profiled forward. Then it decodes --generate tokens
/// greedily after the context and reports tokens/s. The KV room (the most tokens the cache can hold
/// within --kv-memory) is printed first. The forward times are saved as the cost
/// model of `generate --spec ddtree --cost-model`. With --spec it then compares greedy decoding,
/// chain speculation and DDTree (fixed sizes, and cost-aware) with the noisy oracle as the drafter.
///
/// With --spec --drafter dflash --draft-model DIR it times the DFlash drafter's round instead (its
/// forward over the block, the target's LM head, the per-depth top-K of the largest tree) after the
/// first context, --reps times, prints it beside the target's verify forward at every T, puts it
/// into the saved cost model (so that `generate --cost-model` counts it, and the cost-aware size
/// with it), prints the cost model's speed-up at each --assume-tau, and compares greedy decoding, the
/// chain of the block, DDTree of --spec-budget and cost-aware DDTree with the drafter. The drafter's
/// layers run on the host today; its embedding and LM head are the target's, on the GPU.
/// Needs a GPU.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model folder: config.json and safetensors shards.
    #[arg(long)]
    model: PathBuf,
    /// Context tokens in the cache before the timed forwards: a comma-separated list, each measured
    /// in turn (e.g. 64,4096,32768,131072).
    #[arg(long, value_delimiter = ',', default_values_t = [64], value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    context: Vec<usize>,
    /// Largest T of the sweep (powers of two from 1 and the points halfway between: 3, 6, 12, ...).
    #[arg(long, default_value_t = 128)]
    max_t: usize,
    /// Timed forwards per T (after 2 untimed).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Tokens of the greedy decode timed at the end (0: none).
    #[arg(long, default_value_t = 64)]
    generate: usize,
    /// Seed of the random token ids.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Where the forward times go as a cost model [default: forward-cost-<model folder>.json beside
    /// the tuning DB].
    #[arg(long, value_name = "PATH")]
    save_cost: Option<PathBuf>,
    /// Also compare speculative methods: greedy, chain L = 2..8, DDTree B = 4, 8, .. --spec-budget
    /// and cost-aware DDTree (by this run's cost model), each with the noisy oracle at every
    /// --oracle-p, after the first --context; every output is checked against greedy decoding's.
    #[arg(long)]
    spec: bool,
    /// The noisy oracle's accuracies (probability of ranking the true token first) [default:
    /// 0.5,0.7,0.9].
    #[arg(long, value_delimiter = ',', requires = "spec")]
    oracle_p: Option<Vec<f64>>,
    /// The comparison's drafter: the noisy oracle, or a DFlash drafter (--draft-model).
    #[arg(long, value_enum, default_value_t = BenchDrafter::NoisyOracle, requires = "spec")]
    drafter: BenchDrafter,
    /// The DFlash drafter's folder (with --drafter dflash), checked against --model before the GPU
    /// is opened.
    #[arg(long, value_name = "DIR", requires = "spec")]
    draft_model: Option<PathBuf>,
    /// Acceptance lengths (tokens a round, the root counted) at which to print the cost model's
    /// speed-up for rounds verifying the drafter's block, its round counted: e.g. 5.3,5.5, what the
    /// published Kimi-K2.5 DFlash drafter reaches on GSM8K and MATH-500 at block 8.
    #[arg(long, value_delimiter = ',', requires = "draft_model")]
    assume_tau: Vec<f64>,
    /// Tokens each speculative run generates after the context.
    #[arg(long, default_value_t = 64, requires = "spec")]
    spec_tokens: usize,
    /// The largest DDTree budget of the comparison (and the cost-aware one's limit).
    #[arg(long, default_value_t = 128, requires = "spec")]
    spec_budget: usize,
    /// Draw the comparison's speed-ups against p into this SVG file.
    #[arg(long, value_name = "FILE.svg", requires = "spec")]
    plot: Option<PathBuf>,
    /// DDTree's depth in the comparison.
    #[arg(long, default_value_t = 8, requires = "spec")]
    draft_len: usize,
    #[command(flatten)]
    backend: BackendArgs,
}

/// The drafters `bench --spec` compares with.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum BenchDrafter {
    NoisyOracle,
    Dflash,
}

impl BenchArgs {
    /// The noisy oracle's accuracies, the default's if none were given.
    fn oracle_ps(&self) -> Vec<f64> {
        self.oracle_p.clone().unwrap_or_else(|| vec![0.5, 0.7, 0.9])
    }

    /// Refuses options that do not go together, and a DFlash folder that does not fit the model, before
    /// any GPU is opened.
    fn check_drafter(&self) -> anyhow::Result<()> {
        if let Some(p) = self.oracle_ps().iter().find(|p| !(0.0..=1.0).contains(*p)) {
            bail!("--oracle-p {p} is not a probability: the values must lie in [0, 1]");
        }
        if let Some(tau) = self.assume_tau.iter().find(|t| !(t.is_finite() && **t >= 1.0)) {
            bail!("--assume-tau {tau}: an acceptance length counts the root, so it is at least 1");
        }
        match (self.drafter, &self.draft_model) {
            (BenchDrafter::NoisyOracle, Some(_)) => {
                bail!("--draft-model is the DFlash drafter's folder: pass --drafter dflash with it")
            }
            (BenchDrafter::Dflash, None) => bail!("--drafter dflash needs --draft-model: the DFlash drafter's folder"),
            (BenchDrafter::Dflash, Some(dir)) => {
                if self.oracle_p.is_some() {
                    bail!("--oracle-p sets the noisy oracle, and --drafter dflash does not read it: drop --oracle-p");
                }
                let target = Config::load(&self.model.join("config.json"))
                    .with_context(|| format!("--model {}", self.model.display()))?;
                DflashConfig::load(dir, &target).with_context(|| format!("--draft-model {}", dir.display()))?;
            }
            (BenchDrafter::NoisyOracle, None) => {}
        }
        Ok(())
    }
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.reps == 0 || args.max_t == 0 {
        bail!("--reps and --max-t must be at least 1");
    }
    args.check_drafter()?;
    let Some(cuda) = args.backend.open(&args.model, 1)? else {
        bail!("`bench` measures on a GPU, and none is usable here (see the note above, or pass --backend cuda)");
    };
    let cuda = Arc::new(cuda);
    let rss_before = peak_rss();
    let started = std::time::Instant::now();
    let mut model = args.backend.load(&args.model, cuda.clone())?;
    let kv_line = args.backend.configure(&mut model)?;
    cuda.synchronize()?;
    let load_s = started.elapsed().as_secs_f64();
    let c = &model.config;
    let new_tokens = args.max_t.max(args.generate).max(if args.spec { args.spec_tokens + args.draft_len } else { 0 });
    let longest = args.context.iter().copied().max().unwrap_or(0);
    let positions_needed = longest + new_tokens;
    if positions_needed > c.max_position_embeddings {
        bail!(
            "--context {longest} + {new_tokens} new tokens need {positions_needed} positions; max_position_embeddings in config.json is {}",
            c.max_position_embeddings
        );
    }
    let kv_room = model.new_cache().max_tokens()?;
    let kv_per_token = model.heads().kv_bytes_per_token(c.num_hidden_layers);
    let mla_variant = match model.heads().kv.latent() {
        None => cuda.mla_f32_variant().map(|v| kdtree_jit::Variant::name(&v)),
        Some(kv) => cuda.mla_variant(kv).map(|v| kdtree_jit::Variant::name(&v)),
    }
    .unwrap_or_default();
    let kv_line = format!("{kv_line}; attention {mla_variant}");
    eprintln!("{kv_line}; room for {kv_room} tokens within --kv-memory");
    if positions_needed > kv_room {
        bail!(
            "--context {longest} + {new_tokens} new tokens need {positions_needed} KV entries; the cache has room for {kv_room} (--kv-memory)"
        );
    }
    let stream = cuda.stream().clone();
    let mut clock = CudaClock::new(stream.clone());
    let copy_gbps = copy_bandwidth(&stream, &mut clock)?;
    let weights = model.weight_bytes();
    let mut ids = Uniform::new(args.seed);
    let mut random_ids = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| ((ids.next().unwrap_or(0.0) * c.vocab_size as f32) as u32).min(c.vocab_size as u32 - 1))
            .collect()
    };
    let (mut rows, mut contexts) = (Vec::new(), Vec::new());
    let mut first_prompt = None;
    for &context in &args.context {
        let prompt = random_ids(context);
        let mut cache = model.new_cache();
        let start = clock.mark()?;
        let mut next = model.prefill(&mut cache, &prompt)?;
        let end = clock.mark()?;
        let prefill_us = clock.elapsed_us(&start, &end)?;
        eprintln!("context {context}: prefilled in {:.1} ms", prefill_us / 1e3);
        let past = cache.len();
        for t in sweep(args.max_t) {
            let tokens = random_ids(t);
            let positions: Vec<usize> = (past..past + t).collect();
            let forward = |cache: &mut _| -> anyhow::Result<()> {
                KvStore::truncate(cache, past);
                model.forward_argmax(cache, &tokens, &positions, None)?;
                Ok(())
            };
            for _ in 0..2 {
                forward(&mut cache)?;
            }
            let mut samples = Vec::with_capacity(args.reps);
            for _ in 0..args.reps {
                let start = clock.mark()?;
                forward(&mut cache)?;
                let end = clock.mark()?;
                samples.push(clock.elapsed_us(&start, &end)?);
            }
            // The grouped MoE reads its experts-touched count back only while profiling (the routing
            // stays on the GPU otherwise); every rep routes the same tokens, so one forward tells.
            cuda.take_experts_launched();
            cuda.start_profile();
            forward(&mut cache)?;
            let split_us = cuda.take_profile()?;
            let experts = cuda.take_experts_launched() as f64 / weights.moe_layers.max(1) as f64;
            let timing = Timing::from_samples(samples);
            let bytes = ReadBytes::of(&weights, experts, past + t, kv_per_token);
            let floor_us = bytes.floor_us(copy_gbps);
            rows.push(ForwardRow {
                context: past,
                t,
                median_us: timing.median_us,
                p10_us: timing.p10_us,
                p90_us: timing.p90_us,
                experts_per_layer: experts,
                bytes,
                floor_us,
                pct_of_floor: 100.0 * floor_us / timing.median_us,
                split_us,
            });
        }
        // Greedy decoding after the context: one-token forwards, as `generate` runs them.
        KvStore::truncate(&mut cache, past);
        let decode_tps = (args.generate > 1)
            .then(|| -> anyhow::Result<f64> {
                let start = std::time::Instant::now();
                for _ in 1..args.generate {
                    let position = cache.len();
                    next = model.forward_argmax(&mut cache, &[next], &[position], None)?[0];
                }
                Ok(rate(args.generate - 1, start.elapsed().as_secs_f64()))
            })
            .transpose()?;
        contexts.push(ContextRow {
            context: past,
            prefill_us,
            prefill_tokens_per_s: rate(past, prefill_us / 1e6),
            decode_tokens_per_s: decode_tps,
            kv_bytes_per_token: kv_per_token,
        });
        first_prompt.get_or_insert(prompt);
    }
    let prompt = first_prompt.unwrap_or_default();
    let first_context = contexts.first().map_or(0, |r| r.context);
    // The cost model is the first context's forwards.
    let points = rows.iter().filter(|r| r.context == first_context).map(|r| (r.t, r.median_us)).collect();
    let mut cost = CostModel::new(cuda.describe(), args.model.display().to_string(), points)?;
    let cost_path = args.save_cost.clone().unwrap_or_else(|| default_cost_path(&args));
    let progress =
        |r: &spec_sweep::SpecRow| eprintln!("  {} p={:?}: {:.1} tokens/s", r.method, r.p, r.decode_tokens_per_s);
    let dflash = match (&args.draft_model, args.spec) {
        (Some(dir), true) => {
            Some(DflashModel::load(dir, &model).with_context(|| format!("--draft-model {}", dir.display()))?)
        }
        _ => None,
    };
    let (mut spec_rows, mut draft_round) = (Vec::new(), None);
    if let Some(drafter) = &dflash {
        let top_k = args.spec_budget.min(c.vocab_size);
        let mut fresh = DflashDrafter::new(drafter, &model)?;
        let mut timing = round::time_rounds(&model, &mut fresh, "dflash", &prompt, (args.draft_len, top_k), args.reps)?;
        timing.forward_median_us = Some(round::time_forward(&model, drafter, &prompt, args.reps)?);
        eprintln!("dflash drafter round: {:.1} us after {} tokens", timing.median_us, timing.context);
        cost = cost.with_draft_us(timing.median_us)?;
        let beside = round::beside_verify(&cost, timing.median_us);
        let estimates = round::estimates(&cost, &args.assume_tau, drafter.config.block_size);
        let depth = timing.depths;
        draft_round = Some((timing, beside, estimates));
        let methods = spec_sweep::drafter_methods(args.spec_budget, depth, Some(&cost));
        eprintln!("speculative methods: {} with the dflash drafter, {} tokens each", methods.len(), args.spec_tokens);
        let make = || Ok(Box::new(DflashDrafter::new(drafter, &model)?) as Box<dyn Drafter<_> + '_>);
        spec_rows = spec_sweep::compare_drafter(&model, &prompt, args.spec_tokens, &methods, "dflash", make, progress)?;
    } else if args.spec {
        let methods = spec_sweep::methods(args.spec_budget, args.draft_len, Some(&cost));
        let ps = args.oracle_ps();
        eprintln!("speculative methods: {} at p = {ps:?}, {} tokens each", methods.len(), args.spec_tokens);
        spec_rows = spec_sweep::compare(&model, &prompt, args.spec_tokens, &ps, &methods, args.seed, progress)?;
    }
    spec_sweep::estimate(&mut spec_rows, &cost);
    if let Some(path) = args.plot.as_ref().filter(|_| args.spec) {
        kdtree_engine::spec::plot::write_svg(path, &spec_rows)?;
    }
    cost.save(&cost_path)?;
    eprintln!("cost model saved to {}", cost_path.display());
    let (variants, variants_json) = variant_table(&cuda);
    let rss_after = peak_rss();
    if args.json {
        let out = serde_json::json!({
            "model": args.model, "backend": cuda.describe(),
            "mode": format!("{:?}", cuda.mode()), "copy_gbps": copy_gbps, "weights": weights,
            "dtype": model.dtypes(), "kv_dtype": model.heads().kv, "kv_bytes_per_token": kv_per_token, "kv_room_tokens": kv_room, "mla_variant": mla_variant,
            "contexts": contexts, "forwards": rows,
            "load_s": load_s, "peak_rss_before_load": rss_before, "peak_rss_after": rss_after,
            "w4a16_variants": variants_json, "cost_model": cost_path, "spec": spec_rows,
            "draft_round": draft_round.as_ref().map(|(timing, beside, estimates)| serde_json::json!({
                "timing": timing, "beside_verify": beside, "estimates": estimates,
            })),
        });
        return emit(&format!("{out}\n"));
    }
    let mut text = format!(
        "{variants}{} on {}, {:?} mode; loaded in {load_s:.1} s, peak RSS {:.2} GB (before loading {:.2} GB)\n",
        args.model.display(),
        cuda.describe(),
        cuda.mode(),
        rss_after.unwrap_or(0) as f64 / 1e9,
        rss_before.unwrap_or(0) as f64 / 1e9
    );
    text += &format!(
        "weights: {:.2} GB read by every forward, LM head {:.2} GB, {:.1} MB per routed expert x {} x {} MoE layers\n",
        weights.dense as f64 / 1e9,
        weights.lm_head as f64 / 1e9,
        weights.expert as f64 / 1e6,
        weights.experts_per_layer,
        weights.moe_layers
    );
    text += &format!("{kv_line}; room for {kv_room} tokens within --kv-memory\n");
    text += &table(&rows, copy_gbps);
    text += &context_table(&contexts);
    if let Some((timing, beside, estimates)) = &draft_round {
        text += &format!("\n{}", round::table(timing, beside, estimates));
    }
    if !spec_rows.is_empty() {
        let drafter = clap::ValueEnum::to_possible_value(&args.drafter).expect("every drafter has a name");
        text += &format!(
            "\nspeculative decoding, {} drafter, {} tokens after {first_context} of context:\n",
            drafter.get_name(),
            args.spec_tokens
        );
        text += &spec_sweep::table(&spec_rows);
    }
    emit(&text)
}

/// forward-cost-<model folder>.json beside the tuning DB.
fn default_cost_path(args: &BenchArgs) -> PathBuf {
    let db = args.backend.tuning_db.clone().unwrap_or_else(kdtree_jit::tune::db::TuningDb::default_path);
    let name = args.model.file_name().map_or("model".into(), |n| n.to_string_lossy().into_owned());
    db.with_file_name(format!("forward-cost-{name}.json"))
}

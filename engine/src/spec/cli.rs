//! `generate --spec ddtree|chain`: the options, and a speculative run next to plain greedy for
//! comparison.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{
    BlockDrafter, CostModel, DflashConfig, DflashDrafter, DflashModel, Drafter, LookupDrafter, Method, ModelDrafter,
    NoisyOracle, Stats, TreeLimits, speculative_generate,
};
use crate::error::{EngineError, Result};
use crate::generate::greedy_generate;
use crate::model::{Config, Model};
use crate::registry::Backend;
use crate::table::table;

/// Options of speculative decoding, flattened into `generate`. Each but `--spec` needs `--spec`.
#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding method. `ddtree`: draft trees verified in one target forward each;
    /// `chain`: the drafter's top-1 path of --draft-len tokens. The output is identical to greedy
    /// decoding, which also runs, for comparison.
    #[arg(long, value_enum)]
    pub spec: Option<SpecMethod>,
    /// Tree node budget B (the root, i.e. the target's last greedy token, not counted), at most 1024.
    /// With --cost-model, the most nodes a round may take.
    #[arg(long, default_value_t = 32, requires = "spec")]
    pub budget: usize,
    /// Draft length L: how many positions the drafter proposes, the tree's maximum depth; at most 128.
    #[arg(long, default_value_t = 8, requires = "spec")]
    pub draft_len: usize,
    /// Who proposes: `lookup` (n-gram prompt lookup, no weights), `model` (a draft model run greedily L
    /// steps), `block` (one non-causal pass of a model over [bonus, MASK x L]), `dflash` (a DFlash
    /// block-diffusion drafter, --draft-model its folder: one pass a round over the target's features
    /// of every committed token; it drafts at most its block_size - 1 positions), `noisy-oracle` (a
    /// benchmark device, not a drafter: it runs greedy decoding first and proposes its tokens, right
    /// with probability --oracle-p at each position).
    #[arg(long, value_enum, default_value_t = DrafterKind::Lookup, requires = "spec")]
    pub drafter: DrafterKind,
    /// The noisy oracle's probability of ranking the true token first (default 0.7); only with
    /// `--drafter noisy-oracle`.
    #[arg(long, requires = "spec")]
    pub oracle_p: Option<f64>,
    /// Seed of the noisy oracle's draws (default 1); only with `--drafter noisy-oracle`.
    #[arg(long, requires = "spec")]
    pub oracle_seed: Option<u64>,
    /// DDTree only: choose each round's tree size (up to --budget) for the most expected tokens per
    /// µs, by this cost model (JSON; `kdtree-engine bench --save-cost` measures one).
    #[arg(long, value_name = "PATH", requires = "spec")]
    pub cost_model: Option<PathBuf>,
    /// Model folder of the draft model for `--drafter model|block` (default: the target itself), or of
    /// the DFlash drafter for `--drafter dflash` (required).
    #[arg(long, requires = "spec")]
    pub draft_model: Option<PathBuf>,
    /// The block drafter's MASK token id; default: the last id of the vocabulary.
    #[arg(long, requires = "spec")]
    pub mask_token: Option<u32>,
    /// The lookup drafter's longest n-gram.
    #[arg(long, default_value_t = 3, requires = "spec")]
    pub ngram: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecMethod {
    Ddtree,
    Chain,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DrafterKind {
    Lookup,
    Model,
    Block,
    Dflash,
    NoisyOracle,
}

/// What `--draft-model` loads: a model of the target's family, or a DFlash drafter.
pub enum DraftWeights<B: Backend> {
    // Both boxed: the two differ in size by hundreds of bytes, and either is loaded once.
    Model(Box<Model<B>>),
    Dflash(Box<DflashModel<B>>),
}

/// A speculative run and plain greedy decoding of the same prompt, measured in the same run.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub drafter: DrafterKind,
    pub method: Method,
    pub tokens: Vec<u32>,
    /// Whether DDTree's tokens equal greedy decoding's (they must).
    pub identical: bool,
    pub rounds: usize,
    pub tau: f64,
    pub forwards_per_token: f64,
    pub mean_tree_size: f64,
    pub tokens_per_second: f64,
    pub greedy_tokens_per_second: f64,
    /// Of the rounds' time, the share outside the target's forwards (`Stats::host_share`).
    pub host_share: f64,
    pub stats: Stats,
}

impl SpecArgs {
    /// The largest `--budget`: each round verifies B + 1 tokens in one forward whose attention mask
    /// is (B + 1)² entries; the DDTree paper's budgets are at most a few hundred.
    pub(crate) const MAX_BUDGET: usize = 1024;
    /// The largest `--draft-len`: the model drafters hold L rows of the whole vocabulary.
    pub(crate) const MAX_DRAFT_LEN: usize = 128;
    /// The noisy oracle's accuracy and seed without `--oracle-p` and `--oracle-seed`.
    pub(crate) const DEFAULT_ORACLE_P: f64 = 0.7;
    pub(crate) const DEFAULT_ORACLE_SEED: u64 = 1;

    /// Checks the options against the target's config (and the draft model's, read from its
    /// config.json), before any weight is loaded: the budget and the draft length within their
    /// maxima, the MASK token in the vocabulary, and `prompt + max_new` tokens in the draft model's
    /// context (the target's is the caller's to check, [`Config::check_context`]).
    pub fn check(&self, target: &Config, prompt: usize, max_new: usize) -> Result<()> {
        let out_of_range = |what: &str, value: u64, limit: String| {
            Err(EngineError::ArgumentOutOfRange { what: what.into(), value, limit })
        };
        if self.budget > Self::MAX_BUDGET {
            let limit = format!("at most {} tree nodes are verified in one forward", Self::MAX_BUDGET);
            return out_of_range("--budget", self.budget as u64, limit);
        }
        if self.draft_len > Self::MAX_DRAFT_LEN {
            return out_of_range("--draft-len", self.draft_len as u64, format!("at most {}", Self::MAX_DRAFT_LEN));
        }
        if let Some(id) = self.mask_token.filter(|&id| id as usize >= target.vocab_size) {
            let limit = format!("outside the vocabulary of {} (`vocab_size` in config.json)", target.vocab_size);
            return out_of_range("--mask-token", id.into(), limit);
        }
        match (&self.draft_model, self.drafter) {
            // A DFlash drafter's positions are the target's: its context is the target's to check.
            (Some(dir), DrafterKind::Dflash) => drop(DflashConfig::load(dir, target)?),
            (Some(dir), _) => Config::load(&dir.join("config.json"))?.check_context(prompt, max_new)?,
            (None, DrafterKind::Dflash) => return Err(no_dflash_folder()),
            (None, _) => {}
        }
        if self.drafter == DrafterKind::Dflash && self.mask_token.is_some() {
            return Err(EngineError::SpecOption {
                option: "--mask-token".into(),
                problem: "sets the block drafter's mask; a DFlash drafter's is its dflash_config.mask_token_id: drop \
                          --mask-token"
                    .into(),
            });
        }
        self.check_oracle_options()
    }

    /// Refuses the noisy oracle's options with another drafter: they would be ignored, and the run
    /// would not be the one asked for.
    fn check_oracle_options(&self) -> Result<()> {
        let given = [("--oracle-p", self.oracle_p.is_some()), ("--oracle-seed", self.oracle_seed.is_some())];
        match given.into_iter().find(|&(_, given)| given) {
            Some((option, _)) if self.drafter != DrafterKind::NoisyOracle => {
                let drafter = clap::ValueEnum::to_possible_value(&self.drafter).expect("every drafter has a name");
                Err(EngineError::SpecOption {
                    option: option.into(),
                    problem: format!(
                        "sets the noisy oracle, and --drafter {} does not read it: drop {option} or pass --drafter \
                         noisy-oracle",
                        drafter.get_name()
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    /// The most tokens one verification forward runs: B + 1 for DDTree, L + 1 for a chain, 1 without
    /// `--spec`.
    pub fn largest_forward(&self) -> usize {
        match self.spec {
            None => 1,
            Some(SpecMethod::Ddtree) => self.budget + 1,
            Some(SpecMethod::Chain) => self.draft_len + 1,
        }
    }

    /// The `--draft-model`: a model on the target's backend (its INT4 weights uploaded too on CUDA), or a
    /// DFlash drafter checked against the target; `None` when the drafter uses the target itself.
    pub fn load_draft_model<B: Backend>(&self, target: &Model<B>) -> Result<Option<DraftWeights<B>>> {
        let Some(dir) = self.draft_model.as_deref() else { return Ok(None) };
        Ok(Some(match self.drafter {
            DrafterKind::Dflash => DraftWeights::Dflash(Box::new(DflashModel::load(dir, target)?)),
            _ => DraftWeights::Model(Box::new(Model::load_on(dir, target.backend().clone())?)),
        }))
    }

    /// A fresh drafter of the kind `--drafter` names for `target`, drafting with `draft_model` (else
    /// the target). The noisy oracle, which needs greedy decoding's output first, is refused.
    pub fn drafter<'a, B: Backend>(
        &self,
        target: &'a Model<B>,
        draft: Option<&'a DraftWeights<B>>,
    ) -> Result<Box<dyn Drafter<B> + 'a>> {
        let vocab = target.config.vocab_size;
        let draft_model = match draft {
            Some(DraftWeights::Model(model)) => model,
            _ => target,
        };
        Ok(match self.drafter {
            DrafterKind::Dflash => match draft {
                Some(DraftWeights::Dflash(model)) => Box::new(DflashDrafter::new(model, target)?),
                _ => return Err(no_dflash_folder()),
            },
            DrafterKind::Model => Box::new(ModelDrafter::new(draft_model, vocab)?),
            DrafterKind::Block => Box::new(BlockDrafter::new(draft_model, vocab, self.mask_token)?),
            DrafterKind::Lookup => Box::new(LookupDrafter::new(self.ngram, vocab)),
            DrafterKind::NoisyOracle => {
                return Err(EngineError::SpecOption {
                    option: "--drafter noisy-oracle".into(),
                    problem: "names a benchmark device that replays greedy decoding's output, not a drafter: only \
                              SpecArgs::run, which decodes greedily first, runs it"
                        .into(),
                });
            }
        })
    }

    /// The method the options name; `None` without `--spec`.
    pub fn method(&self) -> Result<Option<Method>> {
        let limits = TreeLimits { budget: self.budget, draft_len: self.draft_len };
        Ok(match (self.spec, &self.cost_model) {
            (None, _) => None,
            (Some(SpecMethod::Chain), Some(_)) => {
                return Err(EngineError::SpecOption {
                    option: "--cost-model".into(),
                    problem: "sizes DDTree's trees, not a chain: drop it or pass --spec ddtree".into(),
                });
            }
            (Some(SpecMethod::Chain), None) => Some(Method::Chain { len: self.draft_len }),
            (Some(SpecMethod::Ddtree), None) => Some(Method::Tree(limits)),
            (Some(SpecMethod::Ddtree), Some(path)) => Some(Method::CostAware { limits, cost: CostModel::load(path)? }),
        })
    }

    /// Runs the chosen method with the chosen drafter, then plain greedy decoding (before, for the
    /// noisy oracle, which reads it), and compares. The options and the request are checked first
    /// ([`Self::check`], [`Config::check_context`]).
    pub fn run<B: Backend>(
        &self,
        target: &Model<B>,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
    ) -> Result<Comparison> {
        target.config.check_context(prompt.len(), max_new)?;
        self.check(&target.config, prompt.len(), max_new)?;
        let method =
            self.method()?.unwrap_or(Method::Tree(TreeLimits { budget: self.budget, draft_len: self.draft_len }));
        let timed_greedy = || -> Result<(Vec<u32>, Duration)> {
            let started = Instant::now();
            let tokens = greedy_generate(target, prompt, max_new, stop)?;
            Ok((tokens, started.elapsed()))
        };
        let vocab = target.config.vocab_size;
        let (tokens, stats, greedy) = if self.drafter == DrafterKind::NoisyOracle {
            let greedy = timed_greedy()?;
            let truth = prompt.iter().chain(&greedy.0).copied().collect();
            let p = self.oracle_p.unwrap_or(Self::DEFAULT_ORACLE_P);
            let seed = self.oracle_seed.unwrap_or(Self::DEFAULT_ORACLE_SEED);
            let mut drafter = NoisyOracle::new(truth, p, seed, vocab)?;
            let (tokens, stats) = speculative_generate(target, &mut drafter, prompt, max_new, &method, stop)?;
            (tokens, stats, greedy)
        } else {
            let draft_model = self.load_draft_model(target)?;
            let mut drafter = self.drafter(target, draft_model.as_ref())?;
            let (tokens, stats) = speculative_generate(target, drafter.as_mut(), prompt, max_new, &method, stop)?;
            (tokens, stats, timed_greedy()?)
        };
        Ok(Comparison {
            drafter: self.drafter,
            method,
            identical: tokens == greedy.0,
            rounds: stats.rounds(),
            tau: stats.tau(),
            forwards_per_token: stats.forwards_per_token(),
            mean_tree_size: stats.mean_tree_size(),
            tokens_per_second: stats.tokens_per_second(),
            greedy_tokens_per_second: greedy.0.len() as f64 / greedy.1.max(Duration::from_nanos(1)).as_secs_f64(),
            host_share: stats.host_share(),
            tokens,
            stats,
        })
    }
}

fn no_dflash_folder() -> EngineError {
    EngineError::SpecOption {
        option: "--drafter dflash".into(),
        problem: "needs --draft-model: the DFlash drafter's folder".into(),
    }
}

impl Comparison {
    /// A table for humans: the tokens, then DDTree's figures beside greedy decoding's.
    pub fn table(&self) -> String {
        let tokens: Vec<String> = self.tokens.iter().map(u32::to_string).collect();
        let drafter = format!("{:?}", self.drafter).to_lowercase();
        let rows = [
            ("tokens", self.tokens.len().to_string(), self.tokens.len().to_string()),
            (
                "rounds (target forwards after prefill)",
                self.rounds.to_string(),
                self.tokens.len().saturating_sub(1).to_string(),
            ),
            ("tau: accepted per round, root counted", format!("{:.3}", self.tau), "1.000".into()),
            ("target forwards per token", format!("{:.3}", self.forwards_per_token), "1.000".into()),
            ("mean tree size (root excluded)", format!("{:.1}", self.mean_tree_size), "0".into()),
            ("tokens/s", format!("{:.1}", self.tokens_per_second), format!("{:.1}", self.greedy_tokens_per_second)),
            ("time outside the target forwards", format!("{:.1}%", 100.0 * self.host_share), "".into()),
        ];
        let method = format!("{} drafter={drafter}", self.method.label());
        let mut t = table(&[&method, self.method.name(), "greedy"], &[1, 2]);
        for (name, ours, greedy) in rows {
            t.add_row(vec![name.to_owned(), ours, greedy]);
        }
        let mut out = format!("tokens: {}\n\n{t}\n", tokens.join(","));
        out += &format!("identical to greedy: {}\n", if self.identical { "yes" } else { "NO" });
        out
    }
}

// Test drafters with known quality, the exactness check, and tiny models: each test binary uses part of it.
#![allow(dead_code)]

use kdtree_engine::Result;
use kdtree_engine::registry::Backend;
use kdtree_engine::spec::{Choice, Draft, Drafter, Stats, TreeLimits, ddtree_generate};
use kdtree_engine::{Model, greedy_generate};

/// How a scripted drafter treats the target's true greedy continuation (known in advance).
#[derive(Clone, Copy, Debug)]
pub enum Script {
    /// Proposes only the true token, with probability 1: the whole budget goes down one chain.
    Oracle,
    /// Proposes `n` tokens per depth, never the true one.
    Wrong { n: usize },
    /// Proposes random tokens with random probabilities, the true one among them half of the time.
    Random { seed: u64 },
}

/// A drafter that reads the answer: `text` is the prompt followed by greedy decoding's output.
pub struct Scripted {
    pub text: Vec<u32>,
    pub vocab: usize,
    pub script: Script,
    rng: u64,
}

impl Scripted {
    pub fn new(text: Vec<u32>, vocab: usize, script: Script) -> Scripted {
        let rng = if let Script::Random { seed } = script { seed | 1 } else { 1 };
        Scripted { text, vocab, script, rng }
    }

    fn next(&mut self) -> u64 {
        // xorshift64: deterministic and enough for test proposals.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn depth(&mut self, truth: Option<u32>) -> Vec<Choice> {
        let vocab = self.vocab as u32;
        let others = |n: usize, s: &mut Self| -> Vec<u32> {
            let mut v: Vec<u32> = (0..vocab).filter(|&t| Some(t) != truth).collect();
            for i in 0..v.len() {
                let j = i + (s.next() % (v.len() - i) as u64) as usize;
                v.swap(i, j);
            }
            v.truncate(n);
            v
        };
        match self.script {
            Script::Oracle => truth.map(|token| Choice { token, log_prob: 0.0 }).into_iter().collect(),
            Script::Wrong { n } => {
                others(n, self).into_iter().map(|token| Choice { token, log_prob: -(token as f32 % 3.0) }).collect()
            }
            Script::Random { .. } => {
                let n = (self.next() % 5) as usize;
                let mut tokens = others(n, self);
                if let Some(t) = truth.filter(|_| self.next() & 1 == 0) {
                    tokens.push(t);
                }
                tokens.into_iter().map(|token| Choice { token, log_prob: -((self.next() % 8) as f32) / 2.0 }).collect()
            }
        }
    }
}

impl<B: Backend> Drafter<B> for Scripted {
    fn draft(&mut self, context: &[u32], bonus: u32, len: usize, top_k: usize) -> Result<Draft> {
        let m = context.len() + 1;
        assert_eq!(self.text.get(m - 1), Some(&bonus), "the bonus token is greedy decoding's");
        let truths: Vec<Option<u32>> = (0..len).map(|i| self.text.get(m + i).copied()).collect();
        let depths = truths.into_iter().map(|t| self.depth(t)).collect();
        Draft::from_choices(depths, self.vocab, top_k)
    }
}

/// Runs DDTree with `drafter` and checks it against plain greedy decoding, token for token.
pub fn assert_exact<B: Backend>(
    model: &Model<B>,
    drafter: &mut dyn Drafter<B>,
    prompt: &[u32],
    max_new: usize,
    limits: TreeLimits,
    stop: Option<u32>,
) -> Stats {
    let stop: Vec<u32> = stop.into_iter().collect();
    let greedy = greedy_generate(model, prompt, max_new, &stop).unwrap();
    let (tokens, stats) = ddtree_generate(model, drafter, prompt, max_new, limits, &stop).unwrap();
    assert_eq!(tokens, greedy, "DDTree output differs from greedy decoding ({limits:?})");
    assert_eq!(stats.generated, tokens.len());
    assert_eq!(stats.target_forwards, stats.rounds() + 1, "one forward per round, plus the prefill");
    stats
}

/// The prompt followed by greedy decoding's first `max_new` tokens: what a scripted drafter reads.
pub fn greedy_text<B: Backend>(model: &Model<B>, prompt: &[u32], max_new: usize) -> Vec<u32> {
    let mut text = prompt.to_vec();
    text.extend(greedy_generate(model, prompt, max_new, &[]).unwrap());
    text
}

/// A tiny random model (bf16, or with INT4 routed experts), written to a temporary folder and loaded.
pub fn tiny_model(int4_experts: bool, seed: u64) -> Model {
    let dir = tempfile::tempdir().unwrap();
    let spec = kdtree_engine::tiny::TinySpec { seed, int4_experts, ..Default::default() };
    kdtree_engine::tiny::write_tiny_model(dir.path(), &spec).unwrap();
    Model::load(dir.path()).unwrap()
}

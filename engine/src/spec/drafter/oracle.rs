//! `noisy-oracle`: a benchmark device, not a drafter. It knows the target's greedy continuation and
//! proposes it with a set accuracy, so that speculative methods can be compared on random-weight
//! models (whose text no real drafter can predict) at the acceptance rates real drafters reach.

use kdtree_quant::sample::Uniform;

use super::{Choice, Draft, Drafter};
use crate::error::{EngineError, Result};
use crate::registry::Backend;

/// At every depth the true token (greedy decoding's) is ranked first with probability `p`; otherwise
/// it is ranked r = 2, 3, ... with probability proportional to 2^-(r - 1), or left out when the list
/// is shorter. The other entries are distinct wrong tokens: consecutive ids from a random start, the
/// truth skipped, so that a list of a hundred costs a round no more than a real drafter's top-k (a
/// random-weight target has no relation between neighbouring ids). Each rank carries its marginal
/// as its probability, q(1) = p and q(r) = (1 - p) 2^-(r - 1), so the draft is calibrated: a tree's
/// expected acceptance under the drafter's q is the one the target shows. A rank of probability 0
/// (the first at p = 0, the others at p = 1) is not proposed.
///
/// The draws are keyed by (seed, context length, depth), not by call order, so two methods that reach
/// the same context see the same proposals.
#[derive(Clone, Debug)]
pub struct NoisyOracle {
    /// The prompt followed by greedy decoding's output.
    truth: Vec<u32>,
    p: f64,
    seed: u64,
    vocab: usize,
}

impl NoisyOracle {
    /// `p` in [0, 1]; `truth` is the prompt followed by the target's greedy tokens; a vocabulary of at
    /// least 2 tokens (there must be wrong ones).
    pub fn new(truth: Vec<u32>, p: f64, seed: u64, vocab: usize) -> Result<NoisyOracle> {
        if !(0.0..=1.0).contains(&p) {
            return Err(EngineError::NotAProbability { what: "the noisy oracle's p", value: p });
        }
        if vocab < 2 {
            return Err(EngineError::ArgumentOutOfRange {
                what: "the noisy oracle's vocabulary".into(),
                value: vocab as u64,
                limit: "it needs 2 tokens or more (there must be wrong ones)".into(),
            });
        }
        if let Some(&t) = truth.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id: t, vocab });
        }
        Ok(NoisyOracle { truth, p, seed, vocab })
    }

    /// Depth `depth`'s list of `n` candidates when the text so far is `pos` tokens long.
    fn depth(&self, pos: usize, depth: usize, n: usize) -> Vec<Choice> {
        let mut draws = Uniform::new(self.seed ^ ((pos as u64) << 16 | depth as u64));
        let mut draw = || f64::from(draws.next().unwrap_or(0.0));
        let truth = self.truth.get(pos + depth).copied();
        let n = n.min(self.vocab);
        // The truth's rank (0-based), if it is in the list.
        let rank = match truth {
            Some(_) if draw() < self.p => Some(0),
            Some(_) => {
                // Geometric over ranks 1, 2, ...: rank r with probability 2^-r.
                let r = 1 + (-draw().max(f64::MIN_POSITIVE).log2()).floor() as usize;
                (r < n).then_some(r)
            }
            None => None,
        };
        // Wrong tokens are all but the truth: a list without the truth holds at most vocab - 1.
        let n = if truth.is_some() && rank.is_none() { n.min(self.vocab - 1) } else { n };
        let start = (draw() * self.vocab as f64) as usize;
        let mut wrong = (start..).map(|i| (i % self.vocab) as u32).filter(|&t| Some(t) != truth);
        let tokens = (0..n).filter_map(|r| if Some(r) == rank { truth } else { wrong.next() });
        // log q(r), in logs: one `ln` per list, not per rank.
        let (first, rest) = (self.p.ln(), (1.0 - self.p).ln());
        let log_q = |r: usize| if r == 0 { first } else { rest - r as f64 * std::f64::consts::LN_2 };
        tokens.enumerate().map(|(r, token)| Choice { token, log_prob: log_q(r) as f32 }).collect()
    }
}

impl<B: Backend> Drafter<B> for NoisyOracle {
    fn draft(&mut self, context: &[u32], bonus: u32, len: usize, top_k: usize) -> Result<Draft> {
        if self.truth.get(context.len()) != Some(&bonus) || !self.truth.starts_with(context) {
            return Err(EngineError::shape(
                "noisy oracle",
                "asked to draft after a text that is not greedy decoding's, the only one it knows".into(),
            ));
        }
        let depths = (1..=len).map(|d| self.depth(context.len(), d, top_k)).collect();
        Draft::from_choices(depths, self.vocab, top_k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;

    #[test]
    fn the_truth_ranks_first_about_p_of_the_time_and_draws_are_keyed() {
        let truth: Vec<u32> = (0..2000).map(|i| (i * 7 % 50) as u32).collect();
        let o = NoisyOracle::new(truth.clone(), 0.7, 3, 50).unwrap();
        let first = (0..1000).filter(|&pos| o.depth(pos, 1, 4)[0].token == truth[pos + 1]).count();
        assert!((650..750).contains(&first), "{first} of 1000 first");
        assert_eq!(o.depth(10, 2, 4), o.depth(10, 2, 4));
        let d = o.depth(5, 1, 8);
        let mut tokens: Vec<u32> = d.iter().map(|c| c.token).collect();
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), 8, "distinct");
        assert!(d.windows(2).all(|w| w[0].log_prob > w[1].log_prob), "ranks by probability");
        assert_eq!(d[0].log_prob, 0.7f64.ln() as f32);
    }

    #[test]
    fn p_one_is_the_oracle_and_p_zero_never_ranks_the_truth_first() {
        let truth: Vec<u32> = (0..40).map(|i| (i % 9) as u32).collect();
        let sure: &mut dyn Drafter<CpuBackend> = &mut NoisyOracle::new(truth.clone(), 1.0, 1, 9).unwrap();
        let d = sure.draft(&truth[..10], truth[10], 5, 3).unwrap();
        assert!((1..=5).all(|i| d.at(i)[0].token == truth[10 + i]));
        let never = NoisyOracle::new(truth.clone(), 0.0, 1, 9).unwrap();
        assert!((0..30).all(|pos| never.depth(pos, 1, 3)[0].token != truth[pos + 1]));
        assert!(sure.draft(&[8, 8], 1, 2, 2).is_err(), "not greedy's text");
        assert!(NoisyOracle::new(truth.clone(), 1.5, 1, 9).is_err());
        assert!(NoisyOracle::new(truth.clone(), 0.5, 1, 1).is_err(), "no wrong token to propose");
        assert!(NoisyOracle::new(truth, 0.5, 1, 8).is_err(), "token 8 is outside a vocabulary of 8");
    }
}

//! Prompt lookup: drafts by finding the text's latest n-gram earlier in the text. No weights.

use std::collections::HashMap;

use super::{Choice, Draft, Drafter};
use crate::error::Result;
use crate::registry::Backend;

/// Matches the last `n` tokens of (context, bonus) against earlier text, for the longest `n` from
/// `max_ngram` down to 1 that occurs earlier, and proposes what followed each occurrence: at depth i,
/// q_i(t) = (occurrences followed by t at offset i) / (occurrences). Fallback: when not even the bonus
/// token occurred before, the draft is empty and the round is one plain greedy step.
#[derive(Clone, Debug)]
pub struct LookupDrafter {
    pub max_ngram: usize,
    vocab: usize,
}

impl LookupDrafter {
    pub fn new(max_ngram: usize, vocab: usize) -> LookupDrafter {
        LookupDrafter { max_ngram: max_ngram.max(1), vocab }
    }
}

impl<B: Backend> Drafter<B> for LookupDrafter {
    fn draft(&mut self, context: &[u32], bonus: u32, len: usize, top_k: usize) -> Result<Draft> {
        let text: Vec<u32> = context.iter().copied().chain([bonus]).collect();
        let starts = (1..=self.max_ngram.min(text.len() - 1))
            .rev()
            .map(|n| continuations(&text, n))
            .find(|starts| !starts.is_empty())
            .unwrap_or_default();
        let total = starts.len() as f32;
        let depths = (0..len)
            .map(|i| {
                let mut counts: HashMap<u32, usize> = HashMap::new();
                for t in starts.iter().filter_map(|&s| text.get(s + i)) {
                    *counts.entry(*t).or_default() += 1;
                }
                counts.into_iter().map(|(token, n)| Choice { token, log_prob: (n as f32 / total).ln() }).collect()
            })
            .collect();
        Draft::from_choices(depths, self.vocab, top_k)
    }
}

/// Where the text continued after each earlier occurrence of its last `n` tokens (the occurrence must
/// end before the last token, so that something follows it).
fn continuations(text: &[u32], n: usize) -> Vec<usize> {
    let suffix = &text[text.len() - n..];
    (0..text.len() - n).filter(|&s| &text[s..s + n] == suffix).map(|s| s + n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;

    fn tokens(d: &Draft, depth: usize) -> Vec<u32> {
        d.at(depth).iter().map(|c| c.token).collect()
    }

    #[test]
    fn the_longest_matching_ngram_decides() {
        // "5 6" occurred once, followed by 7 8; "6" alone also occurred followed by 9.
        // The lookup drafter drafts the same for a target on any backend.
        let d: &mut dyn Drafter<CpuBackend> = &mut LookupDrafter::new(2, 16);
        let draft = d.draft(&[6, 9, 1, 5, 6, 7, 8, 2, 5], 6, 3, 4).unwrap();
        assert_eq!((tokens(&draft, 1), tokens(&draft, 2)), (vec![7], vec![8]));
        assert_eq!(draft.at(1)[0].log_prob, 0.0);
        assert_eq!(tokens(&draft, 3), vec![2]);
    }

    #[test]
    fn several_occurrences_share_the_mass_and_no_match_drafts_nothing() {
        let d: &mut dyn Drafter<CpuBackend> = &mut LookupDrafter::new(1, 16);
        let draft = d.draft(&[3, 1, 3, 2, 3, 1], 3, 1, 4).unwrap();
        assert_eq!(tokens(&draft, 1), vec![1, 2]);
        assert!((draft.at(1)[0].log_prob - (2f32 / 3.0).ln()).abs() < 1e-6);
        let none = d.draft(&[1, 2], 3, 4, 4).unwrap();
        assert!((1..=4).all(|i| none.at(i).is_empty()));
    }
}

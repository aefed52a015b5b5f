//! Where a checkpoint keeps its text model's tensors. A causal LM (DeepSeek-V3, Kimi K2) names them
//! as the engine does (`model.layers.N…`, `lm_head.weight`); a Kimi K2.5/K2.6 checkpoint is
//! multimodal and puts them under `language_model.` beside a vision tower and projector, which a
//! text engine skips without reading their data.

use std::fmt;

/// The checkpoint layouts the engine loads, known from config.json's `model_type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// `DeepseekV3ForCausalLM` (`model_type` deepseek_v3 or kimi_k2): the text model alone.
    #[default]
    CausalLm,
    /// `KimiK25ForConditionalGeneration` (`model_type` kimi_k25): the text model's config under
    /// `text_config`, its tensors under `language_model.`, a vision tower and projector beside it.
    KimiK25,
}

impl Layout {
    /// What the checkpoint puts before each text-model tensor name.
    pub(crate) fn text_prefix(self) -> &'static str {
        match self {
            Layout::CausalLm => "",
            Layout::KimiK25 => "language_model.",
        }
    }

    /// The engine's name of checkpoint tensor `name`; `None` for a tensor outside the text model.
    pub(crate) fn text_name(self, name: &str) -> Option<&str> {
        name.strip_prefix(self.text_prefix())
    }
}

/// The tensors of a checkpoint outside its text model (a vision tower, a projector): counted from
/// the shards' headers, never read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub tensors: usize,
    pub bytes: u64,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "skipped {} tensors ({:.1} MB) outside the text model (vision tower, projector): not read",
            self.tensors,
            self.bytes as f64 / 1e6
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_multimodal_layout_renames_and_skips() {
        assert_eq!(Layout::CausalLm.text_name("vision_tower.x.weight"), Some("vision_tower.x.weight"));
        assert_eq!(Layout::KimiK25.text_name("language_model.lm_head.weight"), Some("lm_head.weight"));
        assert_eq!(Layout::KimiK25.text_name("vision_tower.x.weight"), None);
        let s = Skipped { tensors: 3, bytes: 2_500_000 }.to_string();
        assert!(s.starts_with("skipped 3 tensors (2.5 MB)"), "{s}");
    }
}

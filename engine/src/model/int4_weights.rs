//! The INT4 weights a load will hand to the backend, known from config.json and the safetensors
//! headers alone (no weight is read), so that a backend can get their kernels ready before the
//! load: the CUDA backend tunes the shapes its tuning DB lacks.

use std::collections::BTreeSet;
use std::path::Path;

use kdtree_quant::Dtype;

use super::checkpoint::Checkpoint;
use super::config::Config;
use crate::error::Result;

/// One distinct INT4 weight as the backend receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Int4Weight {
    pub n: usize,
    pub k: usize,
    pub group_size: usize,
    /// The scales' dtype.
    pub dtype: Dtype,
    /// A routed expert's weight, which a backend may run other than through per-shape kernels.
    pub routed_expert: bool,
}

/// The distinct INT4 weights of the model in `dir`, sorted: every `*.weight_packed` module of the
/// layers the loader reads (MTP layers beyond `num_hidden_layers` are not) and of the LM head, with
/// each MLP's gate and up projections as the one `[gate; up]` weight the loader stacks them into.
pub fn int4_weights(dir: &Path) -> Result<Vec<Int4Weight>> {
    let config = Config::load(&dir.join("config.json"))?;
    let ckpt = Checkpoint::open(dir, config.layout)?;
    let loaded = |module: &str| {
        let layer = module.strip_prefix("model.layers.").and_then(|rest| rest.split('.').next()?.parse::<usize>().ok());
        module == "lm_head" || layer.is_some_and(|i| i < config.num_hidden_layers)
    };
    let header = |module: &str| ckpt.int4_header(module, config.quant_group(module));
    let mut found = BTreeSet::new();
    for module in ckpt.names().filter_map(|name| name.strip_suffix(".weight_packed")).filter(|m| loaded(m)) {
        // A gate projection is counted with its up projection.
        if module.ends_with(".gate_proj") {
            continue;
        }
        let Some((mut n, k, group_size, dtype)) = header(module)? else { continue };
        if let Some(prefix) = module.strip_suffix(".up_proj")
            && let Some((gate_n, ..)) = header(&format!("{prefix}.gate_proj"))?
        {
            n += gate_n;
        }
        let routed_expert = module.contains(".mlp.experts.");
        found.insert(Int4Weight { n, k, group_size, dtype, routed_expert });
    }
    Ok(found.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiny::{TinySpec, write_tiny_model};

    fn weights_of(spec: &TinySpec) -> Vec<Int4Weight> {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path(), spec).unwrap();
        int4_weights(dir.path()).unwrap()
    }

    #[test]
    fn a_bf16_model_has_none_and_int4_experts_are_gate_up_stacked_and_down() {
        assert_eq!(weights_of(&TinySpec::default()), []);
        let spec = TinySpec { int4_experts: true, ..TinySpec::default() };
        let (h, inter) = (spec.hidden_size, spec.moe_intermediate_size);
        let expert = |n, k| Int4Weight { n, k, group_size: 32, dtype: Dtype::Bf16, routed_expert: true };
        let mut want = vec![expert(2 * inter, h), expert(h, inter)];
        want.sort();
        assert_eq!(weights_of(&spec), want);
    }
}

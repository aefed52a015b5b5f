//! The finite check of a forward. Every forward checks its logits, cheaply: the backend counts their NaN
//! and infinite values with the argmax ([`Backend::argmax_checked`]), or the host does as the logits
//! arrive. When some are not finite, [`super::Model`] runs the forward again from the same cache with a
//! [`Probe`] that checks every op's output in order, and the first op whose output is not finite is the
//! error ([`EngineError::NonFinite`]): "embedding", "layer 2 moe", "lm_head". The re-run costs a copy
//! of every op's output to the host, and happens only on the way to that error.

use std::fmt::Display;

use crate::error::{EngineError, Result};
use crate::ops::cpu::count_nonfinite;
use crate::registry::Backend;

/// Where a forward checks its ops' outputs: nowhere ([`Probe::off`], every normal forward), or after
/// every op ([`Probe::every_op`]).
pub(crate) struct Probe<'a, B: Backend> {
    backend: &'a B,
    every_op: bool,
    /// The decoder layer the ops belong to, for their names.
    layer: Option<usize>,
}

impl<'a, B: Backend> Probe<'a, B> {
    pub fn off(backend: &'a B) -> Self {
        Self { backend, every_op: false, layer: None }
    }

    pub(crate) fn every_op(backend: &'a B) -> Self {
        Self { backend, every_op: true, layer: None }
    }

    /// The same probe, naming ops as those of layer `i`.
    pub fn layer(&self, i: usize) -> Self {
        Self { backend: self.backend, every_op: self.every_op, layer: Some(i) }
    }

    /// [`Self::check`] of a value that only the check needs: `make` runs only when checking every op.
    pub fn check_made(&self, make: impl FnOnce() -> Result<B::Tensor>, op: impl Display) -> Result<()> {
        match self.every_op {
            true => self.check(&make()?, op),
            false => Ok(()),
        }
    }

    /// Checks `x`, the output of `op` (formatted only for the error), when checking every op.
    pub fn check(&self, x: &B::Tensor, op: impl Display) -> Result<()> {
        if !self.every_op {
            return Ok(());
        }
        let values = self.backend.to_host(x)?;
        match count_nonfinite(&values) {
            0 => Ok(()),
            count => {
                let op = match self.layer {
                    Some(i) => format!("layer {i} {op}"),
                    None => op.to_string(),
                };
                Err(EngineError::NonFinite { op, count, total: values.len() })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Model;
    use crate::cpu::{CpuBackend, CpuTensor};
    use crate::registry::KvStore;
    use crate::tiny::{TinySpec, write_tiny_model};

    #[test]
    fn a_checked_forward_of_a_sound_model_finds_nothing_and_changes_nothing() {
        let specs = [
            TinySpec::default(),
            TinySpec { int4_experts: true, ..TinySpec::default() },
            TinySpec { q_lora_rank: None, rope_interleave: false, ..TinySpec::default() },
        ];
        for spec in specs {
            let dir = tempfile::tempdir().unwrap();
            write_tiny_model(dir.path(), &spec).unwrap();
            let model = Model::load(dir.path()).unwrap();
            let (tokens, positions) = ([1, 2, 3], [0, 1, 2]);
            let plain = model.forward(&mut model.new_cache(), &tokens, &positions, None).unwrap();
            let mut cache = model.new_cache();
            let probe = Probe::every_op(&CpuBackend);
            let checked = model.forward_probed(&mut cache, &tokens, &positions, None, &probe).unwrap();
            assert_eq!(checked.data, plain, "{spec:?}");
            assert_eq!(cache.len(), 3);
        }
    }

    #[test]
    fn only_a_checking_probe_looks_and_it_names_the_layer() {
        let bad = CpuTensor { data: vec![1.0, f32::NAN, f32::INFINITY, 0.0], cols: 2 };
        assert!(Probe::off(&CpuBackend).layer(2).check(&bad, "moe").is_ok());
        let probe = Probe::every_op(&CpuBackend);
        let good = CpuTensor { data: vec![1.0, -3.0], cols: 2 };
        assert!(probe.check(&good, "embedding").is_ok());
        let e = probe.layer(2).check(&bad, format_args!("{}.down_proj", "mlp")).unwrap_err();
        assert!(
            matches!(&e, EngineError::NonFinite { op, count: 2, total: 4 } if op == "layer 2 mlp.down_proj"),
            "{e}"
        );
        assert!(e.to_string().starts_with("layer 2 mlp.down_proj: 2 of 4 values are not finite"), "{e}");
        let e = probe.check(&bad, "embedding").unwrap_err();
        assert!(matches!(&e, EngineError::NonFinite { op, .. } if op == "embedding"), "{e}");
    }
}

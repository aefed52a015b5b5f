//! The environment a measurement belongs to. A tuning result is only valid on the device,
//! driver, compiler and templates it was measured with: a change of any of them makes an entry
//! stale, and stale entries are reported, never used.

use serde::{Deserialize, Serialize};

use super::error::Result;
use crate::Gpu;

/// Everything besides the problem that decides which variant is fastest (and that it is correct).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Environment {
    /// The device's marketing name, e.g. "NVIDIA H200".
    pub device: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// The CUDA driver's version as `cuDriverGetVersion` reports it, e.g. 13000.
    pub driver: i32,
    /// NVRTC (major, minor): a new compiler schedules the same source differently.
    pub nvrtc: (i32, i32),
    /// sha256 of every template file: an edited kernel must be re-tuned (cubecl hashes only names).
    pub templates: String,
}

/// One field in which a stored entry's environment differs from the current one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Difference {
    pub field: &'static str,
    pub stored: String,
    pub current: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} was {}, is {}", self.field, self.stored, self.current)
    }
}

impl Environment {
    /// The environment of `gpu` with the NVRTC this process loaded and the templates it embeds.
    pub fn detect(gpu: &Gpu) -> Result<Environment> {
        Ok(Environment {
            device: gpu.name.clone(),
            compute_capability: (gpu.arch.0 / 10, gpu.arch.0 % 10),
            driver: crate::sys::driver_version()?,
            nvrtc: crate::nvrtc_version()?,
            templates: crate::templates_hash().to_owned(),
        })
    }

    /// A fixed environment for tests that store or look up tuning entries without a GPU (one
    /// definition, kept in step with the struct): an H200 on driver and NVRTC 13.0, with a made-up
    /// templates hash of the real length.
    pub fn sample_h200() -> Environment {
        Environment {
            device: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            driver: 13000,
            nvrtc: (13, 0),
            templates: "ab".repeat(32),
        }
    }

    /// The fields in which `self` (a stored entry's) differs from `current`; empty when fresh.
    pub fn differences(&self, current: &Environment) -> Vec<Difference> {
        let fields = [
            ("device", self.device.clone(), current.device.clone()),
            ("compute capability", cc(self.compute_capability), cc(current.compute_capability)),
            ("driver", self.driver.to_string(), current.driver.to_string()),
            ("NVRTC", version(self.nvrtc), version(current.nvrtc)),
            ("templates hash", self.templates.clone(), current.templates.clone()),
        ];
        fields
            .into_iter()
            .filter(|(_, stored, now)| stored != now)
            .map(|(field, stored, current)| Difference { field, stored: short(stored), current: short(current) })
            .collect()
    }
}

fn cc((major, minor): (u32, u32)) -> String {
    format!("{major}.{minor}")
}

fn version((major, minor): (i32, i32)) -> String {
    format!("{major}.{minor}")
}

/// Long values (the templates hash) cut to what a message needs.
fn short(value: String) -> String {
    if value.len() > 16 { value.chars().take(12).collect::<String>() + "…" } else { value }
}

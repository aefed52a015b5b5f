//! GPU architectures by compute capability, and the limits that decide which variants fit.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A compile target: a compute capability as one number, `Arch(90)` is sm_90 (H100/H200), `Arch(120)`
/// sm_120 (RTX 50xx/PRO 6000); with [`Arch::specific`] its arch-specific target (`sm_90a`: wgmma,
/// setmaxnreg), whose cubins run on that capability only. A device's arch is never the specific one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch(pub u32);

const KIB: usize = 1024;

/// The bit of [`Arch::specific`] targets, far above any compute capability.
const SPECIFIC: u32 = 1 << 16;

impl Arch {
    /// The compute capabilities an `--arch` may name: those whose tensor cores run the kernels'
    /// bf16/f16 `mma.sync` and `cp.async` (sm_80 on), that NVRTC 13 targets, and whose shared memory
    /// [`Arch::smem_per_block_max`] knows: Ampere (80, 86, 87), Ada (89), Hopper (90), Blackwell
    /// (100, 103, 120, 121). The project's own targets are sm_90 and sm_120. A device's arch is
    /// taken as the driver reports it, known or not.
    pub(crate) const KNOWN: [u32; 9] = [80, 86, 87, 89, 90, 100, 103, 120, 121];

    /// Hopper's arch-specific target: what `wgmma` needs.
    pub const SM_90A: Arch = Arch(90).specific();

    /// The arch-specific target of this capability (sm_90 -> sm_90a).
    pub const fn specific(self) -> Arch {
        Arch(self.0 | SPECIFIC)
    }

    pub(crate) const fn is_specific(self) -> bool {
        self.0 & SPECIFIC != 0
    }

    /// The compute capability as one number, without the arch-specific mark (sm_90a -> 90).
    pub const fn capability(self) -> u32 {
        self.0 & !SPECIFIC
    }

    /// Whether a cubin for this target loads on a device of arch `device`: the same capability
    /// (the loader checks no more than that either way).
    pub fn runs_on(self, device: Arch) -> bool {
        self.capability() == device.capability()
    }

    /// The most dynamic shared memory one block may use after opting in
    /// (`cudaFuncAttributeMaxDynamicSharedMemorySize`), from the CUDA C Programming Guide's table of
    /// technical specifications per compute capability. Unknown archs get the 48 KiB every arch allows.
    pub fn smem_per_block_max(self) -> usize {
        match self.capability() {
            70 | 72 => 96 * KIB,
            75 => 64 * KIB,
            80 | 87 => 163 * KIB,
            86 | 89 | 120 | 121 => 99 * KIB,
            90 | 100 | 103 => 227 * KIB,
            _ => 48 * KIB,
        }
    }

    /// [`Arch::KNOWN`] as `sm_80, sm_86, ...`.
    pub(crate) fn known_list() -> String {
        Self::KNOWN.map(|c| Arch(c).to_string()).join(", ")
    }

    /// The arch of a device from its compute capability (major, minor).
    pub(crate) fn from_capability(major: i32, minor: i32) -> Arch {
        Arch((major * 10 + minor).unsigned_abs())
    }
}

impl FromStr for Arch {
    type Err = Error;

    /// Accepts `sm_90`, `90`, and the arch-specific `sm_90a`, `90a`, of the `Arch::KNOWN`
    /// capabilities (an arch-specific target from sm_90 on); any other number is
    /// [`Error::UnknownArch`], which lists them, not an NVRTC option error later.
    fn from_str(s: &str) -> Result<Arch> {
        let digits = s.strip_prefix("sm_").unwrap_or(s);
        let (digits, specific) = digits.strip_suffix('a').map_or((digits, false), |d| (d, true));
        let Ok(n) = digits.parse::<u32>() else { return Err(Error::Arch(s.to_owned())) };
        match (Self::KNOWN.contains(&n), specific) {
            (true, false) => Ok(Arch(n)),
            (true, true) if n >= 90 => Ok(Arch(n).specific()),
            _ => Err(Error::UnknownArch { arch: s.to_owned() }),
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.capability(), if self.is_specific() { "a" } else { "" })
    }
}

/// A plain arch is stored as its number, as it always was (tuning DBs hold `"arch": 90`); an
/// arch-specific one by its name (`"sm_90a"`), so that the file says what it is.
impl Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.is_specific() { s.serialize_str(&self.to_string()) } else { s.serialize_u32(self.0) }
    }
}

impl<'de> Deserialize<'de> for Arch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Arch, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Number(u32),
            Name(String),
        }
        match Stored::deserialize(d)? {
            Stored::Number(n) => Ok(Arch(n)),
            Stored::Name(name) => name.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_spellings_and_prints_sm() {
        assert_eq!("sm_90".parse::<Arch>().unwrap(), Arch(90));
        assert_eq!("120".parse::<Arch>().unwrap(), Arch(120));
        assert_eq!(Arch(120).to_string(), "sm_120");
        assert!(matches!("sm_x".parse::<Arch>(), Err(Error::Arch(s)) if s == "sm_x"));
        assert!("9".parse::<Arch>().is_err());
        assert!("sm_9a".parse::<Arch>().is_err() && "sm_a".parse::<Arch>().is_err());
    }

    #[test]
    fn only_known_archs_parse_and_the_error_lists_them() {
        for known in Arch::KNOWN {
            assert_eq!(format!("sm_{known}").parse::<Arch>().unwrap(), Arch(known));
        }
        for unknown in ["sm_999", "sm_65535", "65535", "sm_70", "sm_80a", "sm_999a"] {
            let e = unknown.parse::<Arch>().unwrap_err();
            assert!(matches!(&e, Error::UnknownArch { arch } if arch == unknown), "{e}");
            let message = e.to_string();
            assert!(message.starts_with(&format!("{unknown} is not an arch")), "{message}");
            assert!(message.contains("sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_103, sm_120, sm_121"), "{message}");
        }
        assert!(matches!("sm_65536".parse::<Arch>(), Err(Error::UnknownArch { .. })));
        assert!(matches!("sm_99999999999".parse::<Arch>(), Err(Error::Arch(_))));
    }

    #[test]
    fn the_arch_specific_target_prints_parses_and_stores_as_sm_90a() {
        let a: Arch = "sm_90a".parse().unwrap();
        assert_eq!((a, "90a".parse::<Arch>().unwrap()), (Arch::SM_90A, Arch::SM_90A));
        assert_eq!(a.to_string(), "sm_90a");
        assert!(a.is_specific() && !Arch(90).is_specific());
        assert_ne!(a, Arch(90));
        assert_eq!((a.capability(), a.smem_per_block_max()), (90, Arch(90).smem_per_block_max()));
        assert!(a.runs_on(Arch(90)) && !a.runs_on(Arch(120)) && Arch(90).runs_on(Arch(90)));
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"sm_90a\"");
        assert_eq!(serde_json::to_string(&Arch(90)).unwrap(), "90");
        for arch in [a, Arch(90), Arch(120)] {
            assert_eq!(serde_json::from_str::<Arch>(&serde_json::to_string(&arch).unwrap()).unwrap(), arch);
        }
    }

    #[test]
    fn shared_memory_limits_of_the_target_archs() {
        assert_eq!(Arch(80).smem_per_block_max(), 166_912);
        assert_eq!(Arch(90).smem_per_block_max(), 232_448);
        assert_eq!(Arch(120).smem_per_block_max(), 101_376);
        assert_eq!(Arch::from_capability(9, 0), Arch(90));
    }
}

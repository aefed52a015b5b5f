//! GPU architectures by compute capability, and the limits that decide which variants fit.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A compute capability as one number: `Arch(90)` is sm_90 (H100/H200), `Arch(120)` sm_120 (RTX 50xx/PRO 6000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Arch(pub u32);

const KIB: usize = 1024;

impl Arch {
    /// The most dynamic shared memory one block may use after opting in
    /// (`cudaFuncAttributeMaxDynamicSharedMemorySize`), from the CUDA C Programming Guide's table of
    /// technical specifications per compute capability. Unknown archs get the 48 KiB every arch allows.
    pub fn smem_per_block_max(self) -> usize {
        match self.0 {
            70 | 72 => 96 * KIB,
            75 => 64 * KIB,
            80 | 87 => 163 * KIB,
            86 | 89 | 120 | 121 => 99 * KIB,
            90 | 100 | 103 => 227 * KIB,
            _ => 48 * KIB,
        }
    }

    /// The arch of a device from its compute capability (major, minor).
    pub(crate) fn from_capability(major: i32, minor: i32) -> Arch {
        Arch((major * 10 + minor).unsigned_abs())
    }
}

impl FromStr for Arch {
    type Err = Error;

    /// Accepts `sm_90` or `90`.
    fn from_str(s: &str) -> Result<Arch> {
        let digits = s.strip_prefix("sm_").unwrap_or(s);
        match digits.parse::<u32>() {
            Ok(n) if n >= 10 => Ok(Arch(n)),
            _ => Err(Error::Arch(s.to_owned())),
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.0)
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
    }

    #[test]
    fn shared_memory_limits_of_the_target_archs() {
        assert_eq!(Arch(80).smem_per_block_max(), 166_912);
        assert_eq!(Arch(90).smem_per_block_max(), 232_448);
        assert_eq!(Arch(120).smem_per_block_max(), 101_376);
        assert_eq!(Arch::from_capability(9, 0), Arch(90));
    }
}

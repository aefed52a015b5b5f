//! What `ptxas -v` says about a kernel, parsed from NVRTC's log.

use serde::{Deserialize, Serialize};

/// Resource use of one kernel, from `--ptxas-options=-v`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelStats {
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Static shared memory (dynamic shared memory is the launch's, not the compiler's).
    pub shared_bytes: u32,
    pub stack_bytes: u32,
    /// Whether ptxas reported these numbers. NVRTC 13.0 was seen returning a good cubin with an
    /// empty log, `-v` notwithstanding: then every number above is unknown and left at 0.
    #[serde(default)]
    pub reported: bool,
}

impl KernelStats {
    /// The stats of entry function `name` in a ptxas log, `None` when the log has no such entry:
    ///
    /// ```text
    /// ptxas info    : Compiling entry function 'k' for 'sm_90'
    /// ptxas info    : Function properties for k
    /// ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    /// ptxas info    : Used 34 registers, used 1 barriers, 1024 bytes smem
    /// ```
    pub fn parse(log: &str, name: &str) -> Option<KernelStats> {
        let header = format!("Compiling entry function '{name}'");
        let start = log.find(&header)? + header.len();
        let section = &log[start..];
        let section = &section[..section.find("Compiling entry function").unwrap_or(section.len())];
        let mut stats = KernelStats { reported: true, ..KernelStats::default() };
        for line in section.lines() {
            for clause in line.split([',', ':']).map(str::trim) {
                let words: Vec<&str> = clause.split_whitespace().collect();
                match words.as_slice() {
                    [.., "Used", n, "registers"] => stats.registers = n.parse().ok()?,
                    [.., n, "bytes", "stack", "frame"] => stats.stack_bytes = n.parse().ok()?,
                    [.., n, "bytes", "spill", "stores"] => stats.spill_stores = n.parse().ok()?,
                    [.., n, "bytes", "spill", "loads"] => stats.spill_loads = n.parse().ok()?,
                    [.., n, "bytes", "smem"] => stats.shared_bytes = n.parse().ok()?,
                    _ => {}
                }
            }
        }
        Some(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'small' for 'sm_90'
ptxas info    : Function properties for small
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 7.058 ms
ptxas info    : Compiling entry function 'big' for 'sm_90'
ptxas info    : Function properties for big
ptxas         .     48 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 49.345 ms";

    #[test]
    fn reads_each_entry_on_its_own() {
        let big = KernelStats {
            registers: 255,
            spill_stores: 40,
            spill_loads: 36,
            shared_bytes: 1024,
            stack_bytes: 48,
            reported: true,
        };
        assert_eq!(KernelStats::parse(LOG, "big"), Some(big));
        let small = KernelStats { registers: 8, reported: true, ..KernelStats::default() };
        assert_eq!(KernelStats::parse(LOG, "small"), Some(small));
        assert_eq!(KernelStats::parse(LOG, "missing"), None);
    }
}

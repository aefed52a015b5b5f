//! Printing results on stdout from a command-line program (both workspace binaries), where a println!
//! would panic on a closed or full stdout and a buffered tail would be lost at exit unreported.

use std::error::Error;
use std::io::{ErrorKind, Write};

/// Writes `text` to stdout and flushes it: a failed write is this call's error. A full disk
/// (`> /dev/full`) is an error for the caller to report; a closed pipe (`| head -c1`) one to end on
/// quietly ([`is_closed_pipe`]).
pub fn emit(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Whether `e`, or an error it wraps, is a write to a pipe whose reader went away: nothing is left to
/// say to anyone.
pub fn is_closed_pipe(e: &(dyn Error + 'static)) -> bool {
    std::iter::successors(Some(e), |&e| e.source())
        .any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == ErrorKind::BrokenPipe))
}

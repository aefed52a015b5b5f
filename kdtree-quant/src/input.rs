//! Opening input files (shards, and the engine's JSON files): regular files only.

use std::fs::{File, FileType};
use std::io::{Error, ErrorKind};
use std::path::Path;

/// Opens `path` for reading when it is a regular file (links followed). Anything else is refused
/// before it is opened, with an [`ErrorKind::InvalidInput`] error saying what it is: opening a FIFO
/// for reading blocks until a writer comes (forever, for a FIFO nobody writes), a device such as
/// `/dev/zero` never ends, a directory holds no data. The type is read before opening, as
/// `kdtree-jit`'s cache does; a path swapped for a FIFO between the two is outside the contract.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    let kind = std::fs::metadata(path)?.file_type();
    if !kind.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, format!("is {}, not a regular file", describe(kind))));
    }
    File::open(path)
}

/// What a file that is not a regular file is, in words.
fn describe(kind: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() { "a directory" } else { "not a file" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.json");
        std::fs::write(&file, "{}").unwrap();
        assert!(open_regular(&file).is_ok());
        for (path, says) in [(dir.path(), "is a directory"), (Path::new("/dev/zero"), "is a device")] {
            let e = open_regular(path).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert_eq!(e.to_string(), format!("{says}, not a regular file"));
        }
        assert_eq!(open_regular(&dir.path().join("none")).unwrap_err().kind(), ErrorKind::NotFound);
    }
}

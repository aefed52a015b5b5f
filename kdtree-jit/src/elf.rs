//! Reading a shared library's ELF headers and dynamic symbols from its file, before anything maps it.
//!
//! The dynamic loader trusts a library's headers: a truncated file is mapped past its end and the
//! process dies of SIGBUS at the first touch, and a library that is not the one expected (libz where
//! NVRTC should be) runs its initialisers and then fails in cudarc, which panics on a missing symbol.
//! So the file is read first: every extent its headers declare must lie inside it, and its soname
//! and defined dynamic symbols are returned for the caller to judge. Only 64-bit little-endian ELF is
//! read, the only kind the CUDA libraries ship as on Linux (x86-64 and aarch64).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::LibraryProblem;

/// The part of a library's dynamic section the caller judges it by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Dynamic {
    /// `DT_SONAME`: the name the loader matches later `dlopen`s by name against.
    pub soname: Option<String>,
    /// The names of the symbols it defines (not those it imports).
    pub symbols: Vec<String>,
}

// ELF constants (the System V ABI): file type, section types, dynamic tags.
const ET_DYN: u16 = 3;
const SHT_DYNSYM: u32 = 11;
const SHT_DYNAMIC: u32 = 6;
const DT_SONAME: u64 = 14;
const EHDR_BYTES: usize = 64;
const PHDR_BYTES: u64 = 56;
const SHDR_BYTES: u64 = 64;
const SYM_BYTES: usize = 24;
const DYN_BYTES: usize = 16;
/// The most bytes of one table (symbols, their names) read into memory: libnvrtc's are under 64 KiB.
const MAX_TABLE_BYTES: u64 = 64 << 20;

/// One section header's fields that matter here.
struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    /// The index of the string table that holds the section's names (for symbol and dynamic tables).
    link: u32,
}

/// Checks the library file at `path` and reads its [`Dynamic`] part.
pub(crate) fn read_dynamic(path: &Path) -> Result<Dynamic, LibraryProblem> {
    let file = File::open(path).map_err(|e| LibraryProblem::Unreadable { reason: e.to_string() })?;
    let size = file.metadata().map_err(|e| LibraryProblem::Unreadable { reason: e.to_string() })?.len();
    let elf = Elf { file, size };
    // The magic first, so that a short file that is not ELF at all is called that, not truncated.
    let mut header = [0u8; EHDR_BYTES];
    elf.read_into(0, &mut header[..size.min(EHDR_BYTES as u64) as usize])?;
    if header[..4] != *b"\x7fELF" {
        return Err(LibraryProblem::NotElf);
    }
    elf.within(0, EHDR_BYTES as u64)?;
    // EI_CLASS 2: 64-bit; EI_DATA 1: little-endian.
    if header[4] != 2 || header[5] != 1 || u16_at(&header, 16) != ET_DYN {
        return Err(LibraryProblem::NotSharedLibrary);
    }
    let (phoff, shoff) = (u64_at(&header, 32), u64_at(&header, 40));
    let (phnum, shnum) = (u64::from(u16_at(&header, 56)), u64::from(u16_at(&header, 60)));
    if u64::from(u16_at(&header, 54)) != PHDR_BYTES || (shnum > 0 && u64::from(u16_at(&header, 58)) != SHDR_BYTES) {
        return Err(LibraryProblem::NotSharedLibrary);
    }
    // What the loader maps: every segment's bytes in the file.
    let phdrs = elf.read(phoff, phnum * PHDR_BYTES)?;
    for phdr in phdrs.chunks_exact(PHDR_BYTES as usize) {
        elf.within(u64_at(phdr, 8), u64_at(phdr, 32))?;
    }
    let sections: Vec<Section> = elf
        .read(shoff, shnum * SHDR_BYTES)?
        .chunks_exact(SHDR_BYTES as usize)
        .map(|s| Section { kind: u32_at(s, 4), offset: u64_at(s, 24), size: u64_at(s, 32), link: u32_at(s, 40) })
        .collect();
    let mut dynamic = Dynamic::default();
    for section in &sections {
        match section.kind {
            SHT_DYNSYM => {
                let (symbols, names) = elf.table(section, &sections)?;
                for symbol in symbols.chunks_exact(SYM_BYTES) {
                    // st_shndx 0: undefined here, an import.
                    if u16_at(symbol, 6) != 0 {
                        dynamic.symbols.push(string_at(&names, u32_at(symbol, 0).into()));
                    }
                }
            }
            SHT_DYNAMIC => {
                let (entries, names) = elf.table(section, &sections)?;
                if let Some(entry) = entries.chunks_exact(DYN_BYTES).find(|e| u64_at(e, 0) == DT_SONAME) {
                    dynamic.soname = Some(string_at(&names, u64_at(entry, 8)));
                }
            }
            _ => {}
        }
    }
    Ok(dynamic)
}

/// The file and its size, read at checked offsets only.
struct Elf {
    file: File,
    size: u64,
}

impl Elf {
    /// `Truncated` unless `[offset, offset + len)` lies inside the file.
    fn within(&self, offset: u64, len: u64) -> Result<(), LibraryProblem> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            end => Err(LibraryProblem::Truncated { needs: end.unwrap_or(u64::MAX), size: self.size }),
        }
    }

    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), LibraryProblem> {
        self.within(offset, buf.len() as u64)?;
        self.file.read_exact_at(buf, offset).map_err(|e| LibraryProblem::Unreadable { reason: e.to_string() })
    }

    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, LibraryProblem> {
        if len > MAX_TABLE_BYTES {
            return Err(LibraryProblem::NotSharedLibrary);
        }
        self.within(offset, len)?;
        let mut buf = vec![0; len as usize];
        self.read_into(offset, &mut buf)?;
        Ok(buf)
    }

    /// The bytes of `section` and of the string table it links to.
    fn table(&self, section: &Section, sections: &[Section]) -> Result<(Vec<u8>, Vec<u8>), LibraryProblem> {
        let names = sections.get(section.link as usize).ok_or(LibraryProblem::NotSharedLibrary)?;
        Ok((self.read(section.offset, section.size)?, self.read(names.offset, names.size)?))
    }
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

/// The NUL-terminated string at `at` of string table `table` (empty when out of range).
fn string_at(table: &[u8], at: u64) -> String {
    let tail = usize::try_from(at).ok().and_then(|at| table.get(at..)).unwrap_or_default();
    let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
    String::from_utf8_lossy(&tail[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary's own C library: an ELF shared library on every Linux machine.
    fn libc() -> std::path::PathBuf {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let path = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).unwrap();
        path.into()
    }

    #[test]
    fn a_library_s_soname_and_symbols_are_read() {
        let dynamic = read_dynamic(&libc()).unwrap();
        assert_eq!(dynamic.soname.as_deref(), Some("libc.so.6"));
        assert!(dynamic.symbols.iter().any(|s| s == "malloc"), "{:?}", &dynamic.symbols[..10]);
    }

    #[test]
    fn a_truncated_or_foreign_file_is_refused_unmapped() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = std::fs::read(libc()).unwrap();
        let cut = dir.path().join("cut.so");
        for len in [bytes.len() - 1, bytes.len() / 2, 100] {
            std::fs::write(&cut, &bytes[..len]).unwrap();
            let problem = read_dynamic(&cut).unwrap_err();
            assert!(matches!(problem, LibraryProblem::Truncated { size, .. } if size == len as u64), "{problem:?}");
        }
        for foreign in [&b"#!/bin/sh\n"[..], &[b'x'; 100], b""] {
            std::fs::write(&cut, foreign).unwrap();
            assert!(matches!(read_dynamic(&cut), Err(LibraryProblem::NotElf)), "{foreign:?}");
        }
    }
}

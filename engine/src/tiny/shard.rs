//! Safetensors shards written without holding them: the header needs only names, dtypes and
//! shapes, so it is written first and every piece of tensor data goes straight to its offset.
//!
//! The header is the safetensors crate's own (`Metadata` serialized, padded to 8 bytes with
//! spaces) and tensors are ordered as its serializer orders them (by descending dtype alignment,
//! then name), so a shard is byte-for-byte what `safetensors::serialize` would make of the same
//! tensors, and every tensor is aligned to its element size.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use rayon::prelude::*;
use safetensors::tensor::{Metadata, TensorInfo};

use super::fill;
use super::plan::{Meta, Unit};
use crate::error::{EngineError, Result};

/// One shard: its units, and where each of their tensors' data starts in the file.
pub(crate) struct Shard<'a> {
    pub name: String,
    pub units: Vec<&'a Unit>,
    header: Vec<u8>,
    /// `offsets[u][t]`: file offset of tensor `t` of unit `u`.
    offsets: Vec<Vec<u64>>,
}

impl<'a> Shard<'a> {
    pub fn new(name: String, units: Vec<&'a Unit>) -> Result<Self> {
        let mut order: Vec<(usize, usize, &Meta)> = units
            .iter()
            .enumerate()
            .flat_map(|(u, unit)| unit.tensors.iter().enumerate().map(move |(t, m)| (u, t, m)))
            .collect();
        order.sort_by(|(_, _, a), (_, _, b)| b.dtype.cmp(&a.dtype).then(a.name.cmp(&b.name)));
        let mut data_offsets: Vec<Vec<u64>> = units.iter().map(|u| vec![0; u.tensors.len()]).collect();
        let mut infos = Vec::with_capacity(order.len());
        let mut at = 0u64;
        for (u, t, m) in order {
            data_offsets[u][t] = at;
            let info = TensorInfo {
                dtype: m.dtype,
                shape: m.shape.clone(),
                data_offsets: (at as usize, (at + m.bytes()) as usize),
            };
            infos.push((m.name.clone(), info));
            at += m.bytes();
        }
        // What Hugging Face's save_pretrained records: the framework the tensors came from.
        let format = HashMap::from([("format".to_owned(), "pt".to_owned())]);
        let bad = |reason: String| EngineError::ShardHeader { shard: name.clone(), reason };
        let metadata = Metadata::new(Some(format), infos).map_err(|e| bad(e.to_string()))?;
        let mut header = serde_json::to_string(&metadata).map_err(|e| bad(e.to_string()))?.into_bytes();
        header.resize(header.len().next_multiple_of(8), b' ');
        let data_start = 8 + header.len() as u64;
        let offsets = data_offsets.into_iter().map(|o| o.into_iter().map(|x| x + data_start).collect()).collect();
        Ok(Self { name, units, header, offsets })
    }

    /// Bytes of the whole file.
    pub(crate) fn file_bytes(&self) -> u64 {
        8 + self.header.len() as u64 + self.tensor_bytes()
    }

    pub fn tensor_bytes(&self) -> u64 {
        self.units.iter().map(|u| u.bytes()).sum()
    }

    /// Writes the shard into `file` (empty), making its pieces on all cores; `progress` hears of every
    /// piece's bytes as they land. Errors name `path`, where the file is going.
    pub fn write(&self, file: &File, path: &Path, seed: u64, progress: &(dyn Fn(u64) + Sync)) -> Result<()> {
        let io = |source| EngineError::Io { file: path.display().to_string(), source };
        file.set_len(self.file_bytes()).map_err(io)?;
        let mut head = (self.header.len() as u64).to_le_bytes().to_vec();
        head.extend_from_slice(&self.header);
        write_at(file, &head, 0).map_err(io)?;
        let pieces: Vec<(usize, fill::Piece<'_>)> =
            self.units.iter().enumerate().flat_map(|(u, unit)| fill::pieces(unit).map(move |p| (u, p))).collect();
        pieces.par_iter().try_for_each(|(u, piece)| {
            for (t, at, bytes) in piece.make(seed) {
                write_at(file, &bytes, self.offsets[*u][t] + at).map_err(io)?;
                progress(bytes.len() as u64);
            }
            Ok(())
        })
    }
}

#[cfg(unix)]
fn write_at(file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
}

#[cfg(windows)]
fn write_at(file: &File, mut bytes: &[u8], mut offset: u64) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let n = std::os::windows::fs::FileExt::seek_write(file, bytes, offset)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n..];
        offset += n as u64;
    }
    Ok(())
}

//! What a safetensors header must also satisfy, beyond what the safetensors crate checks or words
//! well: no tensor named twice (its parser keeps the last entry of a name without a word), and
//! offsets reported against the tensor they are wrong for, not the one after it in offset order.

use std::collections::HashSet;
use std::fmt;

use safetensors::tensor::TensorInfo;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The header's tensor entries in file order, duplicates kept, `__metadata__` left out.
struct Entries(Vec<(String, TensorInfo)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a safetensors header object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if name == "__metadata__" {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        entries.push((name, map.next_value::<TensorInfo>()?));
                    }
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// The reason a safetensors file's header is unsound, if it is. A header that does not even parse
/// passes: the safetensors crate then says what is wrong with it.
pub(crate) fn check(file: &[u8]) -> Result<(), String> {
    let Some((length, rest)) = file.split_first_chunk::<8>() else { return Ok(()) };
    let Some(header) = usize::try_from(u64::from_le_bytes(*length)).ok().and_then(|n| rest.get(..n)) else {
        return Ok(());
    };
    let Ok(Entries(entries)) = serde_json::from_slice(header) else { return Ok(()) };
    let data = rest.len() - header.len();
    let mut seen = HashSet::new();
    if let Some((name, _)) = entries.iter().find(|(name, _)| !seen.insert(name.as_str())) {
        return Err(format!("tensor `{name}` is listed twice in the header"));
    }
    for (name, info) in &entries {
        check_one(name, info, data)?;
    }
    check_tiling(&entries, data)
}

/// One tensor's offsets on their own: in order, within the data, as long as its dtype and shape need.
fn check_one(name: &str, info: &TensorInfo, data: usize) -> Result<(), String> {
    let (start, end) = info.data_offsets;
    let offsets = format!("tensor `{name}`: data_offsets [{start}, {end}]");
    if end < start {
        return Err(format!("{offsets} end before they start"));
    }
    if end > data {
        return Err(format!("{offsets} run past the end of the data ({data} bytes)"));
    }
    let bits = info.shape.iter().try_fold(info.dtype.bitsize(), |bits, &d| bits.checked_mul(d));
    match bits {
        None => Err(format!("tensor `{name}`: shape {:?} has more elements than memory can hold", info.shape)),
        // Sub-byte sizes are the safetensors crate's to refuse.
        Some(bits) if bits % 8 != 0 || bits / 8 == end - start => Ok(()),
        Some(bits) => Err(format!(
            "{offsets} hold {} bytes, but {:?} of shape {:?} is {} bytes",
            end - start,
            info.dtype,
            info.shape,
            bits / 8
        )),
    }
}

/// All tensors together: sorted by offset they cover the data exactly, with no gap and no overlap.
fn check_tiling(entries: &[(String, TensorInfo)], data: usize) -> Result<(), String> {
    let mut by_offset: Vec<&(String, TensorInfo)> = entries.iter().collect();
    by_offset.sort_by_key(|(_, info)| info.data_offsets);
    let mut covered = 0;
    let mut previous: Option<&str> = None;
    for (name, info) in by_offset {
        let (start, end) = info.data_offsets;
        let after = previous.map_or_else(|| "the start of the data".to_owned(), |p| format!("tensor `{p}`"));
        if start < covered {
            return Err(format!("tensor `{name}` (bytes {start}..{end}) overlaps {after} (which ends at {covered})"));
        }
        if start > covered {
            return Err(format!("bytes {covered}..{start} between {after} and tensor `{name}` belong to no tensor"));
        }
        covered = end;
        previous = Some(name);
    }
    if covered < data {
        let after = previous.map_or_else(|| "the header".to_owned(), |p| format!("tensor `{p}`"));
        return Err(format!("{} bytes after {after} belong to no tensor", data - covered));
    }
    Ok(())
}

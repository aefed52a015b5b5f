use crate::error::{EngineError, Result};

/// Copies row `ids[i]` of `table` ([vocab, dim]) to row `i` of `out` ([ids.len(), dim]).
pub fn embedding(table: &[f32], dim: usize, ids: &[u32], out: &mut [f32]) -> Result<()> {
    let vocab = table.len() / dim.max(1);
    if out.len() != ids.len() * dim {
        return Err(EngineError::shape(
            "embedding",
            format!("out holds {} values, {} ids x {dim} need {}", out.len(), ids.len(), ids.len() * dim),
        ));
    }
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(dim.max(1))) {
        let row = table.get(id as usize * dim..(id as usize + 1) * dim);
        match row {
            Some(row) if (id as usize) < vocab => o.copy_from_slice(row),
            _ => return Err(EngineError::TokenOutOfRange { id, vocab }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_gathered_and_out_of_range_ids_are_errors() {
        let table = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0];
        let mut out = [0.0; 4];
        embedding(&table, 2, &[2, 0], &mut out).unwrap();
        assert_eq!(out, [20.0, 21.0, 0.0, 1.0]);
        let err = embedding(&table, 2, &[3, 0], &mut out).unwrap_err();
        assert!(matches!(err, EngineError::TokenOutOfRange { id: 3, vocab: 3 }));
    }
}

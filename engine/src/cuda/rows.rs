//! Rows that grow by appends on the device, with room kept ahead: a drafter's context keys and
//! values, which gain a few rows a round and are read whole by every round's attention.

use cudarc::driver::CudaSlice;

use super::{CudaBackend, CudaTensor};
use crate::error::{EngineError, Result};
use crate::registry::RowStore;

/// Rows the first append makes room for at least, so that a round's few rows rarely reallocate.
const FIRST_ROOM: usize = 256;

/// f32 rows of `cols` on the GPU: `data` holds the `rows` rows, then room for more.
pub struct CudaRows {
    pub(super) data: CudaSlice<f32>,
    rows: usize,
    cols: usize,
}

impl RowStore for CudaRows {
    fn len(&self) -> usize {
        self.rows
    }

    fn truncate(&mut self, len: usize) {
        self.rows = self.rows.min(len);
    }
}

impl CudaRows {
    pub(super) fn new(b: &CudaBackend, cols: usize) -> Result<CudaRows> {
        Ok(CudaRows { data: b.output(cols)?, rows: 0, cols })
    }

    pub(super) fn cols(&self) -> usize {
        self.cols
    }

    /// Appends `x`'s rows; when they do not fit, the rows move once to a buffer of twice the room.
    pub(super) fn append(&mut self, b: &CudaBackend, x: &CudaTensor) -> Result<()> {
        if x.cols != self.cols {
            return Err(EngineError::shape("append_rows", format!("rows of {} onto rows of {}", x.cols, self.cols)));
        }
        let (held, need) = (self.rows * self.cols, (self.rows + x.rows) * self.cols);
        let s = b.stream();
        if need > self.data.len() {
            let room = need.max(2 * self.data.len()).max(FIRST_ROOM * self.cols);
            let mut grown = b.output::<f32>(room)?;
            if held > 0 {
                s.memcpy_dtod(&self.data.slice(0..held), &mut grown.slice_mut(0..held))?;
            }
            self.data = grown;
        }
        if need > held {
            s.memcpy_dtod(&x.data.slice(0..need - held), &mut self.data.slice_mut(held..need))?;
        }
        self.rows += x.rows;
        Ok(())
    }
}

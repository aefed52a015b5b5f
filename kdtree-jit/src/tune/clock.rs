//! Where time comes from. On the GPU, CUDA events recorded on the stream time the kernel alone,
//! not the host's launch overhead; tests implement [`Clock`] with a counter their fake work advances.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use super::error::Result;

/// Marks points in a stream of work and measures the time between two of them.
pub trait Clock {
    type Mark;
    /// Marks "now" in the order of the enqueued work (not necessarily in host time).
    fn mark(&mut self) -> Result<Self::Mark>;
    /// Microseconds from `from` to `to`, waiting for the work between them if needed.
    fn elapsed_us(&mut self, from: &Self::Mark, to: &Self::Mark) -> Result<f64>;
}

/// CUDA events on one stream: the time the GPU spent between two marks.
pub struct CudaClock {
    stream: Arc<CudaStream>,
}

impl CudaClock {
    pub fn new(stream: Arc<CudaStream>) -> CudaClock {
        CudaClock { stream }
    }
}

impl Clock for CudaClock {
    type Mark = CudaEvent;

    fn mark(&mut self) -> Result<CudaEvent> {
        // Timing events: the default flags (cudarc's `None` would disable timing).
        Ok(self.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?)
    }

    fn elapsed_us(&mut self, from: &CudaEvent, to: &CudaEvent) -> Result<f64> {
        Ok(from.elapsed_ms(to)? as f64 * 1e3)
    }
}

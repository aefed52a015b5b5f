// The GPU the CUDA tests run on, opened the same way by each test binary that uses it.
#![allow(dead_code)]

use kdtree_engine::cuda::{CudaBackend, CudaOptions, KvBudget, Mode, MoeKernels};

/// GPU 0 with no tuning DB (a missing file: every W4A16 shape runs its default variant), exact mode
/// tuned for one row, grouped MoE, CUDA graphs, KV pages within 90% of the free memory, FP8 layers
/// widened for many rows.
pub fn options() -> CudaOptions {
    CudaOptions {
        ordinal: 0,
        tuning_db: "/nonexistent/tuning.json".into(),
        mode: Mode::Exact { m: 1 },
        moe: MoeKernels::default(),
        graphs: true,
        kv_budget: KvBudget::default(),
        mla: None,
        fp8_widen: true,
    }
}

/// [`options`] opened; panics without a GPU (the tests that call it are `#[ignore]`d).
pub fn cuda() -> CudaBackend {
    CudaBackend::open(&options()).expect("a GPU")
}

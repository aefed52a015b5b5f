//! The grouped MoE candidates on the GPU: a layer's experts uploaded once, each step's inputs and
//! tile tables, and the [`Runner`] that gates and times a variant on one step, the gate-up launch
//! then the down launch. [`MoeSession`] is a [`Session`] tuning MoE steps instead of GEMMs: the
//! same clock, flush, compile cache and DB records.

use std::collections::HashMap;

use cudarc::driver::CudaSlice;
use kdtree_quant::{Dtype, QuantizedWeight};

use super::db::{Entry, TuningDb};
use super::env::Environment;
use super::error::{Result, TuneError};
use super::flush::Flusher;
use super::key::{MoeShape, ProblemKey};
use super::moe::{MoeLayer, MoeStep};
use super::peers::Peers;
use super::problem::from_bits;
use super::run::Tuner;
use super::search::{self, Runner, SearchConfig};
use super::session::{AtM, Session, Tuned, now_unix};
use crate::w4a16::grouped::{
    DeviceRows, Epilogue, GroupedBuffers, GroupedKernel, GroupedShape, W4a16Grouped, align, repack_experts, tile_bound,
};
use crate::{Arch, Cache, Gpu, Variant};

/// A session that tunes grouped MoE steps.
pub struct MoeSession<'s, 'g>(pub &'s mut Session<'g>);

/// One projection of every expert on the device, stacked as the grouped kernel reads them.
struct Stacked {
    packed: CudaSlice<u32>,
    scales: CudaSlice<u16>,
}

impl Stacked {
    /// `experts` experts, expert e holding `distinct[e % len]`. Every grouped variant of one group
    /// size and dtype reads one layout (stream's), so `v` may be any of them.
    fn upload(gpu: &Gpu, v: &W4a16Grouped, distinct: &[QuantizedWeight], experts: usize) -> Result<Stacked> {
        let d = repack_experts(v, distinct)?;
        let (packed_len, scales_len) = (d.packed.len() / distinct.len(), d.scales.len() / distinct.len());
        let s = &gpu.stream;
        let (src_packed, src_scales) = (s.clone_htod(&d.packed)?, s.clone_htod(&d.scales)?);
        let mut packed = s.alloc_zeros::<u32>(experts * packed_len)?;
        let mut scales = s.alloc_zeros::<u16>(experts * scales_len)?;
        for e in 0..experts {
            let i = e % distinct.len();
            let (from, to) = (i * packed_len..(i + 1) * packed_len, e * packed_len..(e + 1) * packed_len);
            s.memcpy_dtod(&src_packed.slice(from), &mut packed.slice_mut(to))?;
            let (from, to) = (i * scales_len..(i + 1) * scales_len, e * scales_len..(e + 1) * scales_len);
            s.memcpy_dtod(&src_scales.slice(from), &mut scales.slice_mut(to))?;
        }
        Ok(Stacked { packed, scales })
    }
}

/// One step's inputs and outputs on the device.
struct StepBuffers {
    x: CudaSlice<u16>,
    act: CudaSlice<u16>,
    sorted: CudaSlice<u32>,
    /// Per tile height of the candidates: the tile table, padded to the kernel's bound, and its count.
    tiles: Vec<(u32, CudaSlice<u32>, CudaSlice<u32>)>,
    gate_up: CudaSlice<u16>,
    down: CudaSlice<u16>,
    /// NaN in both f16 and bf16 (all bits set), written over both outputs before each gated run.
    poison: Vec<u16>,
}

impl StepBuffers {
    fn upload(gpu: &Gpu, layer: &MoeLayer, step: &MoeStep, candidates: &[W4a16Grouped]) -> Result<StepBuffers> {
        let s = &gpu.stream;
        let (experts, rows) = (layer.shape.experts as usize, step.sorted.len());
        let mut heights: Vec<u32> = candidates.iter().map(|v| v.bm).collect();
        heights.sort_unstable();
        heights.dedup();
        let mut tiles = Vec::new();
        for bm in heights {
            let a = align(&step.ids, experts, bm as usize);
            let mut words = a.tile_words();
            words.resize(3 * tile_bound(experts, rows, bm as usize).max(1), 0);
            tiles.push((bm, s.clone_htod(&words)?, s.clone_htod(&[a.tiles.len() as u32])?));
        }
        let (n_gu, n_down) = (layer.shape.gate_up.n as usize, layer.shape.down.n as usize);
        Ok(StepBuffers {
            x: s.clone_htod(&step.x)?,
            act: s.clone_htod(&step.act)?,
            sorted: s.clone_htod(&step.sorted)?,
            tiles,
            gate_up: s.alloc_zeros(rows * n_gu)?,
            down: s.alloc_zeros(rows * n_down)?,
            poison: vec![u16::MAX; rows * n_gu.max(n_down)],
        })
    }
}

/// Runs grouped variants on one MoE step.
struct MoeRunner<'a> {
    gpu: &'a Gpu,
    layer: &'a MoeLayer,
    step: &'a MoeStep,
    kernels: &'a HashMap<String, GroupedKernel>,
    weights: &'a [Stacked; 2],
    buffers: &'a mut StepBuffers,
    flusher: &'a mut Flusher,
}

impl Runner for MoeRunner<'_> {
    type Candidate = W4a16Grouped;

    fn name(&self, v: &W4a16Grouped) -> String {
        v.name()
    }

    /// Both products' outputs, gate-up's then down's, each divided by its reference's scale.
    fn output(&mut self, v: &W4a16Grouped) -> Result<Vec<f32>> {
        // An output element the kernel does not write stays NaN and fails the gate.
        let s = self.gpu.stream.clone();
        let b = &mut *self.buffers;
        for y in [&mut b.gate_up, &mut b.down] {
            let len = y.len();
            s.memcpy_htod(&b.poison[..len], y)?;
        }
        self.launch(v)?;
        let (gate_up, down) = (s.clone_dtoh(&self.buffers.gate_up)?, s.clone_dtoh(&self.buffers.down)?);
        s.synchronize()?;
        let dtype = self.layer.dtype;
        let [up_scale, down_scale] = self.step.scales;
        let scaled = |bits: Vec<u16>, scale: f32| bits.into_iter().map(move |b| from_bits(dtype, b) / scale);
        Ok(scaled(gate_up, up_scale).chain(scaled(down, down_scale)).collect())
    }

    fn tolerance(&self, v: &W4a16Grouped) -> f64 {
        // A row's bits are the stream variant's of the same axes.
        crate::w4a16::tolerance(&v.stream())
    }

    fn prepare(&mut self, _: &W4a16Grouped) -> Result<()> {
        // No split-K: nothing is kept between runs.
        Ok(())
    }

    fn launch(&mut self, v: &W4a16Grouped) -> Result<()> {
        let name = v.name();
        let kernel = self.kernels.get(&name).ok_or_else(|| TuneError::Problem(format!("{name} was not compiled")))?;
        let b = &mut *self.buffers;
        let (_, tiles, count) = b
            .tiles
            .iter()
            .find(|(bm, ..)| *bm == v.bm)
            .ok_or_else(|| TuneError::Problem(format!("no tiles of {} rows for {name}", v.bm)))?;
        let shape = self.layer.shape;
        let (experts, top_k, rows) = (shape.experts as usize, shape.top_k as usize, self.step.sorted.len());
        let [gate_up, down] = self.weights;
        let up_shape = GroupedShape {
            experts,
            n: shape.gate_up.n as usize,
            k: shape.gate_up.k as usize,
            x_rows: self.step.tokens,
            y_rows: rows,
        };
        let up = GroupedBuffers {
            x: b.x.as_view(),
            rows: DeviceRows::Gather { index: b.sorted.as_view(), div: top_k },
            packed: &gate_up.packed,
            scales: &gate_up.scales,
            tiles: tiles.as_view(),
            tile_count: count.as_view(),
            y: b.gate_up.as_view_mut(),
        };
        // The plain store, which the gate checks against its reference; the engine's SiLU epilogue
        // differs only in its last stores (half as many).
        kernel.launch(self.gpu, Epilogue::Store, up_shape, up)?;
        let down_shape =
            GroupedShape { experts, n: shape.down.n as usize, k: shape.down.k as usize, x_rows: rows, y_rows: rows };
        let down = GroupedBuffers {
            x: b.act.as_view(),
            rows: DeviceRows::Identity,
            packed: &down.packed,
            scales: &down.scales,
            tiles: tiles.as_view(),
            tile_count: count.as_view(),
            y: b.down.as_view_mut(),
        };
        Ok(kernel.launch(self.gpu, Epilogue::Store, down_shape, down)?)
    }

    fn flush(&mut self) -> Result<()> {
        self.flusher.flush(&self.gpu.stream)
    }
}

impl Tuner for MoeSession<'_, '_> {
    type Variant = W4a16Grouped;
    type Kernel = GroupedKernel;

    fn env(&self) -> &Environment {
        &self.0.env
    }

    fn arch(&self) -> Arch {
        self.0.gpu.arch
    }

    fn sms(&self) -> u32 {
        self.0.sms
    }

    fn compile(
        &self,
        variants: &[W4a16Grouped],
        db: &mut TuningDb,
        cache: Option<&Cache>,
        retry_failed: bool,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<HashMap<String, GroupedKernel>> {
        let arch = self.0.gpu.arch;
        self.0.compile_with(variants, |_| arch, db, cache, retry_failed, progress, GroupedKernel::load)
    }

    /// The layer's experts are made and uploaded once; each T gets its routing, inputs and
    /// reference, then its candidates are searched as one MoE step each.
    fn tune_shape(
        &mut self,
        (shape, group_size, dtype): (MoeShape, u32, Dtype),
        work: &[AtM<W4a16Grouped>],
        kernels: &HashMap<String, GroupedKernel>,
        cfg: &SearchConfig,
        proceed: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(),
    ) -> Result<Vec<Tuned>> {
        let session = &mut *self.0;
        let gpu = session.gpu;
        let compiled = |vs: &[W4a16Grouped]| -> Vec<W4a16Grouped> {
            vs.iter().filter(|v| kernels.contains_key(&v.name())).copied().collect()
        };
        let first = work.iter().find_map(|(_, vs)| compiled(vs).first().copied());
        let first = first.ok_or_else(|| TuneError::Problem(format!("no variant for {shape}")))?;
        let layer = MoeLayer::random(shape, group_size, dtype)?;
        let experts = shape.experts as usize;
        let weights = [
            Stacked::upload(gpu, &first, &layer.gate_up, experts)?,
            Stacked::upload(gpu, &first, &layer.down, experts)?,
        ];
        let mut results = Vec::new();
        for (tokens, candidates) in work {
            if !proceed() {
                break;
            }
            let candidates = compiled(candidates);
            let step = layer.step(*tokens)?;
            let mut buffers = StepBuffers::upload(gpu, &layer, &step, &candidates)?;
            let mut runner = MoeRunner {
                gpu,
                layer: &layer,
                step: &step,
                kernels,
                weights: &weights,
                buffers: &mut buffers,
                flusher: &mut session.flusher,
            };
            let outcome =
                search::search(&mut runner, &mut session.clock, &candidates, &step.reference, cfg, &mut *progress)?;
            let key = ProblemKey::moe(*tokens, &shape, group_size, dtype, gpu.arch);
            let entry = outcome.best.map(|best| Entry {
                key: key.clone(),
                env: session.env.clone(),
                variant: best.name,
                m: *tokens,
                timing: best.timing,
                error: best.error,
                // No dense peer for a grouped step; the copy bandwidth gives its floor.
                peers: Peers { cublas_bf16: None, cublas_f16: None, copy_gbps: session.copy_gbps },
                bytes: layer.bytes(&step),
                timed: outcome.timed.len() as u32,
                rejected: outcome.rejected.clone(),
                tuned_at_unix: now_unix(),
            });
            results.push(Tuned { key, entry, rejected: outcome.rejected });
        }
        Ok(results)
    }
}

//! `kdtree-jit bench`: measures again what the tuning DB holds for this GPU, without retuning.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::bail;

use kdtree_jit::tune::db::Entry;
use kdtree_jit::tune::report::Row;
use kdtree_jit::tune::session::Session;
use kdtree_jit::w4a16::dense::DenseVariant;
use kdtree_jit::{Cache, Variant};

use super::tune::{Output, bar, stale_rows};

/// Re-measure the tuning DB's winners for this GPU (gate, time, cuBLAS, copy bandwidth) and print
/// them as `tune` does. Entries measured elsewhere are listed as stale and skipped.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub out: Output,
}

pub fn run(args: &BenchArgs, nvrtc: Option<&Path>) -> anyhow::Result<()> {
    let gpu = args.out.open_gpu(nvrtc, "bench")?;
    let mut session = Session::open(&gpu, args.out.flush)?;
    let (db_path, mut db) = args.out.open_db()?;
    let stale = stale_rows(&db, &session, &db_path);
    // GEMMs only: an MoE step is measured again by tuning it again (`tune --preset kimi-k2-moe`).
    let (fresh, _) = db.partition(&session.env);
    let fresh: Vec<Entry> = fresh.into_iter().filter(|e| e.key.moe.is_none()).cloned().collect();
    if fresh.is_empty() {
        bail!("{} holds no GEMM entry for this GPU and software: run `kdtree-jit tune` first", db_path.display());
    }
    let mut by_problem: BTreeMap<_, Vec<&Entry>> = BTreeMap::new();
    for e in &fresh {
        by_problem.entry((e.key.shape(), e.key.group_size, e.key.dtype)).or_default().push(e);
    }

    let mut variants: Vec<DenseVariant> = fresh.iter().filter_map(|e| DenseVariant::from_name(&e.variant)).collect();
    variants.sort_by_key(|v| v.name());
    variants.dedup();
    let cache = Cache::open(&Cache::default_dir())?;
    let compiling = bar(variants.len() as u64, "compile");
    let kernels =
        session.compile(&variants, &mut db, Some(&cache), true, |done| compiling.set_position(done as u64))?;
    compiling.finish_and_clear();

    let mut rows = Vec::new();
    let measuring = bar(fresh.len() as u64, "bench");
    for entries in by_problem.values() {
        for tuned in session.bench_shape(entries, &kernels)? {
            measuring.inc(1);
            match tuned.entry {
                Some(entry) => rows.push(Row::from_entry(&entry)),
                None => measuring.suspend(|| {
                    let why: Vec<&str> = tuned.rejected.iter().map(|r| r.reason.as_str()).collect();
                    let why = if why.is_empty() {
                        "it is no longer in the variant space or did not compile".to_owned()
                    } else {
                        why.join("; ")
                    };
                    eprintln!("{} M={}: the DB's variant failed: {why}", tuned.key.shape(), tuned.key.m_bucket)
                }),
            }
        }
    }
    measuring.finish_and_clear();
    args.out.emit(&session, rows, stale)
}

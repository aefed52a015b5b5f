//! NVRTC to CUBIN for sm_90 and sm_120 without a GPU, NVRTC found the way users get it (the probe).

use std::path::Path;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use kdtree_jit::w4a16::W4a16;
use kdtree_jit::{Arch, Cache, Error, Gpu, Target, Variant, compile_all, compile_source, nvrtc_version};

const SCALE: &str = r#"
extern "C" __global__ void scale(float* x, float k, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= k;
}"#;

const ARCHS: [Arch; 2] = [Arch(90), Arch(120)];

#[test]
fn nvrtc_is_found_and_is_13() {
    assert_eq!(nvrtc_version().unwrap().0, 13);
}

#[test]
fn a_kernel_compiles_to_a_cubin_for_each_arch() {
    for arch in ARCHS {
        let c = compile_source("scale", "inline", SCALE, arch, None).unwrap();
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{arch}: a cubin is an ELF file");
        assert!(c.stats.registers > 0 && c.stats.spill_stores == 0, "{arch}: {:?}", c.stats);
        assert_eq!((c.name.as_str(), c.arch, c.cached), ("scale", arch, false));
    }
}

#[test]
fn a_compile_error_names_origin_and_variant_and_shows_the_log_as_text() {
    let source = SCALE.replace("*= k", "*= undeclared_k");
    let err = compile_source("scale", "scale.cu.tera", &source, Arch(90), None).unwrap_err();
    let Error::Compile { origin, variant, log } = &err else { panic!("expected a compile error, got {err:?}") };
    assert_eq!((origin.as_str(), variant.as_str()), ("scale.cu.tera", "scale"));
    assert!(log.contains("undeclared_k") && log.contains("scale.cu"), "{log}");
    let message = err.to_string();
    assert!(message.contains("scale.cu.tera") && message.contains('\n') && !message.contains("\\n"), "{message}");
}

#[test]
fn a_source_without_the_named_kernel_is_a_compile_error() {
    let err = compile_source("other", "inline", SCALE, Arch(120), None).unwrap_err();
    assert!(matches!(&err, Error::Compile { log, .. } if log.contains("`other`")), "{err}");
}

#[test]
fn opening_a_gpu_that_is_not_there_is_an_error_not_a_panic() {
    let err = Gpu::open(usize::MAX).unwrap_err();
    assert!(matches!(err, Error::NoDriver { .. } | Error::NoGpu { .. }), "{err:?}");
}

#[test]
#[ignore = "needs a GPU"]
fn a_compiled_kernel_loads_and_runs_and_a_cubin_for_another_arch_is_refused() {
    let gpu = Gpu::open(0).unwrap();
    let f = gpu.load(&compile_source("scale", "inline", SCALE, gpu.arch, None).unwrap()).unwrap();
    let n = 1000u32;
    let mut x = gpu.stream.clone_htod(&vec![1.5f32; n as usize]).unwrap();
    let mut launch = gpu.stream.launch_builder(&f);
    launch.arg(&mut x).arg(&2.0f32).arg(&n);
    // SAFETY: `scale` touches x[0..n), which x holds, and takes (float*, float, unsigned) as passed.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap();
    assert_eq!(gpu.stream.clone_dtoh(&x).unwrap(), vec![3.0f32; n as usize]);

    let other = if gpu.arch == Arch(120) { Arch(90) } else { Arch(120) };
    let foreign = compile_source("scale", "inline", SCALE, other, None).unwrap();
    assert!(matches!(gpu.load(&foreign), Err(Error::WrongArch { .. })));
}

/// The CI gate: every valid point of the default space compiles for both archs, and those that serve
/// M <= 64 do not spill. Cached under target/, so a rerun with unchanged templates takes seconds.
#[test]
fn every_valid_w4a16_variant_compiles_for_sm_90_and_sm_120() {
    let cache = Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap();
    for arch in ARCHS {
        let valid = W4a16::valid(&Target { arch });
        let start = Instant::now();
        let results = compile_all(&valid, arch, Some(&cache), |_| {});
        let mut failures = Vec::new();
        for (v, result) in &results {
            match result {
                Err(e) => failures.push(e.to_string()),
                Ok(c) if !c.stats.reported => failures.push(format!("{}: ptxas reported no stats", c.name)),
                Ok(c) if v.bm <= 64 && (c.stats.spill_stores > 0 || c.stats.spill_loads > 0) => {
                    failures.push(format!("{} spills: {:?}", c.name, c.stats))
                }
                Ok(_) => {}
            }
        }
        let cached = results.iter().filter(|(_, r)| r.as_ref().is_ok_and(|c| c.cached)).count();
        eprintln!("{arch}: {} variants ({cached} cached) in {:.1?}", results.len(), start.elapsed());
        assert_eq!(results.len(), valid.len());
        assert!(failures.is_empty(), "{arch}:\n{}", failures.join("\n"));
    }
}

//! The `kdtree-jit` binary, run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use kdtree_jit::dense16::Dense16;
use kdtree_jit::w4a16::W4a16;
use kdtree_jit::{Arch, Target, Variant};

fn kdtree_jit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kdtree-jit")).args(args).env_remove("KDTREE_NVRTC_DIR").output().unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[test]
fn help_names_every_environment_variable() {
    let help = stdout(&kdtree_jit(&["--help"]));
    assert!(help.contains("KDTREE_NVRTC_DIR") && help.contains("KDTREE_CACHE_DIR"), "{help}");
    assert!(help.contains("The cubin cache is created private (0700)"), "{help}");
    for command in ["list", "render", "compile", "tune", "bench"] {
        assert!(help.contains(command), "{help}");
    }
}

#[test]
fn list_json_holds_the_valid_variants_of_every_family_and_all_adds_the_invalid_with_reasons() {
    let valid: serde_json::Value =
        serde_json::from_str(&stdout(&kdtree_jit(&["list", "--arch", "sm_90", "--json"]))).unwrap();
    let of = |family: &str| -> Vec<&str> {
        let points = valid.as_array().unwrap().iter().filter(|v| v["family"] == family);
        points.map(|v| v["name"].as_str().unwrap()).collect()
    };
    let expected: Vec<String> = W4a16::valid(&Target { arch: Arch(90) }).iter().map(Variant::name).collect();
    assert_eq!(of(W4a16::SPACE), expected);
    // Every family by default: the grouped MoE, MLA and dense16 ones too, and wgmma (sm_90a).
    for family in ["w4a16_wgmma", "w4a16_grouped", "mla_decode", "dense16"] {
        assert!(!of(family).is_empty(), "{family}");
    }
    let one: serde_json::Value =
        serde_json::from_str(&stdout(&kdtree_jit(&["list", "--arch", "90", "--family", "tiles", "--json"]))).unwrap();
    assert_eq!(one.as_array().unwrap().len(), expected.len());

    let all: serde_json::Value = serde_json::from_str(&stdout(&kdtree_jit(&[
        "list", "--arch", "90", "--family", "tiles", "--family", "dense16", "--all", "--json",
    ])))
    .unwrap();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), W4a16::all().len() + Dense16::all().len());
    assert!(all.iter().all(|v| v["valid"].as_bool().unwrap() == v["reason"].is_null()));
    // The table ends with each family's count.
    let table = stdout(&kdtree_jit(&["list", "--arch", "90"]));
    assert!(table.contains(&format!("{} of {} w4a16 variants are valid on sm_90", expected.len(), W4a16::all().len())));
    assert!(table.contains("dense16 variants are valid on sm_90"), "{}", &table[table.len() - 600..]);
}

#[test]
fn render_prints_the_source_of_either_family_and_rejects_unknown_names() {
    let tiles = W4a16::valid(&Target { arch: Arch(120) })[0].name();
    let wgmma = "w4a16_wgmma_bf16_g32_m128n128k128_s4_sk1_f32acc";
    for name in [tiles.as_str(), wgmma] {
        assert!(stdout(&kdtree_jit(&["render", name])).contains(&format!(" {name}(")), "{name}");
    }
    let unknown = kdtree_jit(&["render", "w4a16_nope"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("`w4a16_nope` is not a w4a16 or mla variant"));
}

#[test]
fn compile_prints_json_and_uses_the_cache_on_a_second_run() {
    let cache = tempfile::tempdir().unwrap();
    let name = W4a16::valid(&Target { arch: Arch(120) })[0].name();
    let args =
        ["compile", "--arch", "sm_120", "--filter", &name, "--json", "--cache-dir", cache.path().to_str().unwrap()];
    for cached in [false, true] {
        let summary: serde_json::Value = serde_json::from_str(&stdout(&kdtree_jit(&args))).unwrap();
        assert_eq!(summary["errors"].as_array().unwrap().len(), 0);
        let compiled = summary["compiled"].as_array().unwrap();
        assert_eq!(compiled.len(), 1);
        assert_eq!(
            (compiled[0]["name"].as_str().unwrap(), compiled[0]["cached"].as_bool().unwrap()),
            (name.as_str(), cached)
        );
    }
}

#[test]
fn compile_with_an_nvrtc_dir_that_lacks_it_fails_saying_where_it_looked() {
    let empty = tempfile::tempdir().unwrap();
    let output = kdtree_jit(&["compile", "--arch", "90", "--no-cache", "--nvrtc", empty.path().to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("NVRTC (libnvrtc.so.13) not found") && stderr.contains(&empty.path().display().to_string()),
        "{stderr}"
    );
}

/// Fails, and returns stderr.
fn failure(args: &[&str]) -> String {
    let output = kdtree_jit(args);
    assert!(!output.status.success(), "{args:?} succeeded");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn tune_and_bench_without_the_gpu_they_ask_for_say_so_and_fail() {
    // Ordinal 99: no machine has it, so this holds on a GPU machine too (and tunes nothing there).
    for command in ["tune", "bench"] {
        let mut args = vec![command, "--gpu", "99"];
        if command == "tune" {
            args.extend(["--shape", "256,512", "--m", "1"]);
        }
        let stderr = failure(&args);
        assert!(stderr.contains(&format!("`{command}` measures on a GPU")), "{stderr}");
        assert!(stderr.contains("no CUDA driver") || stderr.contains("GPU 99"), "{stderr}");
    }
}

#[test]
fn tune_rejects_bad_arguments_before_looking_for_a_gpu() {
    let stderr = failure(&["tune", "--preset", "llama"]);
    assert!(stderr.contains("unknown preset `llama`: the presets are kimi-k2"), "{stderr}");
    let stderr = failure(&["tune", "--shape", "4096,7168", "--flush", "sideways"]);
    assert!(stderr.contains("read") && stderr.contains("write"), "the flush modes are listed: {stderr}");
    let stderr = failure(&["tune", "--shape", "100"]);
    assert!(stderr.contains("expected N,K such as 4096,7168"), "{stderr}");
}

#[test]
fn tune_of_the_moe_preset_needs_a_gpu_and_takes_routing_only_there() {
    let help = stdout(&kdtree_jit(&["tune", "--help"]));
    assert!(help.contains("kimi-k2-moe") && help.contains("--routing") && help.contains("401 for both routings"));
    for routing in ["uniform", "skewed", "both"] {
        let stderr = failure(&["tune", "--preset", "kimi-k2-moe", "--routing", routing, "--gpu", "99"]);
        assert!(stderr.contains("`tune` measures on a GPU"), "{stderr}");
        assert!(stderr.contains("no CUDA driver") || stderr.contains("GPU 99"), "{stderr}");
    }
    let stderr = failure(&["tune", "--shape", "256,512", "--routing", "skewed"]);
    assert!(stderr.contains("--routing is for the MoE presets (kimi-k2-moe) only"), "{stderr}");
    let stderr = failure(&["tune", "--preset", "kimi-k2-moe", "--plot", "moe.svg"]);
    assert!(stderr.contains("`kimi-k2-moe` tunes MoE steps"), "{stderr}");
    let stderr = failure(&["tune", "--preset", "kimi-k2-moe", "--routing", "hot"]);
    assert!(stderr.contains("uniform") && stderr.contains("skewed"), "the routings are listed: {stderr}");
}

#[test]
fn tune_of_the_mla_preset_needs_a_gpu_and_takes_rows_and_contexts_only_there() {
    let help = stdout(&kdtree_jit(&["tune", "--help"]));
    assert!(help.contains("kimi-k2-mla") && help.contains("--rows") && help.contains("--context"), "{help}");
    let stderr = failure(&["tune", "--preset", "kimi-k2-mla", "--rows", "1,64", "--context", "4096", "--gpu", "99"]);
    assert!(stderr.contains("`tune` measures on a GPU"), "{stderr}");
    let stderr = failure(&["tune", "--preset", "kimi-k2-mla", "--rows", "0"]);
    assert!(stderr.contains("--rows must be in 1..=1024"), "{stderr}");
    let stderr = failure(&["tune", "--preset", "kimi-k2", "--context", "4096"]);
    assert!(stderr.contains("--rows and --context are for --preset kimi-k2-mla only"), "{stderr}");
    let stderr = failure(&["tune", "--preset", "llama"]);
    assert!(stderr.contains("kimi-k2-mla"), "{stderr}");
}

#[test]
fn compile_with_a_filter_that_matches_nothing_fails_saying_so() {
    // Before NVRTC is looked for: an empty --nvrtc dir does not change the answer.
    let empty = tempfile::tempdir().unwrap();
    let stderr =
        failure(&["compile", "--arch", "90", "--filter", "w4a16_nosuch", "--nvrtc", empty.path().to_str().unwrap()]);
    assert!(stderr.contains("no variant valid on sm_90 has `w4a16_nosuch` in its name"), "{stderr}");
    assert!(stderr.contains("kdtree-jit list --arch sm_90"), "{stderr}");
}

#[test]
fn the_mla_families_are_listed_rendered_and_compiled_like_the_gemms() {
    use kdtree_jit::mla::{MlaAux, MlaDecode};
    let listed: serde_json::Value =
        serde_json::from_str(&stdout(&kdtree_jit(&["list", "--arch", "120", "--family", "mla", "--all", "--json"])))
            .unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), MlaDecode::all().len());
    let valid: Vec<&str> =
        listed.iter().filter(|v| v["valid"].as_bool().unwrap()).map(|v| v["name"].as_str().unwrap()).collect();
    let expected: Vec<String> = MlaDecode::valid_on(Arch(120)).iter().map(Variant::name).collect();
    assert_eq!(valid, expected);
    assert!(listed.iter().any(|v| v["reason"].as_str().is_some_and(|r| r.contains("shared memory"))));

    let decode = MlaDecode::default_for(&Target { arch: Arch(90) }).name();
    let aux = MlaAux::default_for(&Target { arch: Arch(90) });
    assert!(stdout(&kdtree_jit(&["render", &decode])).contains(&format!(" {decode}_combine(")));
    assert!(stdout(&kdtree_jit(&["render", &aux.name()])).contains(&aux.gather_name()));

    let f32 = kdtree_jit::mla_f32::MlaF32::default_for(&Target { arch: Arch(90) });
    assert!(stdout(&kdtree_jit(&["render", &f32.name()])).contains(&f32.gather_name()));

    // An FP8 cache's variants render their widening; the bf16 ones do not.
    let fp8 = MlaDecode::default_for_kv(&Target { arch: Arch(90) }, kdtree_jit::mla::MlaKv::Fp8);
    assert!(stdout(&kdtree_jit(&["render", &fp8.name()])).contains("constexpr bool KV_FP8 = true;"));
    assert!(stdout(&kdtree_jit(&["render", &decode])).contains("constexpr bool KV_FP8 = false;"));
    let fp8_aux = MlaAux::beside(&fp8);

    // One variant of each family, through the same command as the GEMMs (the CI gate compiles all).
    let families = [
        ("mla", decode),
        ("mla", fp8.name()),
        ("mla-aux", aux.name()),
        ("mla-aux", fp8_aux.name()),
        ("mla-f32", f32.name()),
    ];
    for (family, name) in families {
        let args = ["compile", "--arch", "90", "--family", family, "--filter", &name, "--json", "--no-cache"];
        let summary: serde_json::Value = serde_json::from_str(&stdout(&kdtree_jit(&args))).unwrap();
        assert_eq!(summary["errors"].as_array().unwrap().len(), 0);
        let compiled = summary["compiled"].as_array().unwrap();
        assert_eq!(compiled.len(), 1);
        assert_eq!(compiled[0]["name"].as_str().unwrap(), name);
    }
}

#[test]
fn an_unknown_arch_is_refused_naming_it_and_the_known_ones() {
    for args in [["list", "--arch", "sm_999"], ["list", "--arch", "sm_65535"], ["compile", "--arch", "sm_999"]] {
        let output = kdtree_jit(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("{} is not an arch kdtree compiles for", args[2])), "{args:?}: {stderr}");
        assert!(stderr.contains("sm_90, sm_100, sm_103, sm_120, sm_121"), "{args:?}: {stderr}");
        assert!(!stderr.contains("NVRTC") && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// Fails with exit code 1 (an error, not a signal or a panic), and returns stderr.
fn error(args: &[&str]) -> String {
    let output = kdtree_jit(args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{args:?}: {:?}\n{stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

/// The workspace's NVRTC, which scripts/test.sh installs from PyPI.
fn nvrtc_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nvrtc/nvidia/cu13/lib")
}

#[test]
fn an_nvrtc_that_is_another_library_or_truncated_is_refused_before_it_is_loaded() {
    let builtins = std::fs::read_dir(nvrtc_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("libnvrtc-builtins.so"))
        .unwrap();
    // Another library under NVRTC's name: cudarc would panic at its first NVRTC symbol.
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(&builtins, other.path().join("libnvrtc.so.13")).unwrap();
    // A truncated NVRTC ("it is truncated: its headers describe N bytes, the file has M"): the loader
    // would map it past its end and die of SIGBUS.
    let truncated = tempfile::tempdir().unwrap();
    let mut whole = std::fs::File::open(nvrtc_dir().join("libnvrtc.so.13")).unwrap();
    let half = whole.metadata().unwrap().len() / 2;
    let mut cut = std::fs::File::create(truncated.path().join("libnvrtc.so.13")).unwrap();
    std::io::copy(&mut std::io::Read::take(&mut whole, half), &mut cut).unwrap();
    for (dir, says) in [
        (other.path(), "its soname is libnvrtc-builtins.so".to_owned()),
        (truncated.path(), format!("bytes, the file has {half}")),
    ] {
        let stderr = error(&["compile", "--arch", "90", "--no-cache", "--nvrtc", dir.to_str().unwrap()]);
        let lib = dir.join("libnvrtc.so.13").display().to_string();
        assert!(stderr.contains(&format!("{lib} is not NVRTC (libnvrtc.so.13)")), "{stderr}");
        assert!(stderr.contains(&says) && stderr.contains("pip install"), "{stderr}");
    }
}

#[test]
fn empty_path_variables_are_named_not_taken_for_a_missing_flag() {
    for (var, args) in [
        ("KDTREE_NVRTC_DIR", &["list", "--arch", "90"][..]),
        ("KDTREE_CACHE_DIR", &["compile", "--arch", "90", "--filter", "w4a16_nosuch"]),
        ("KDTREE_TUNING_DB", &["tune", "--shape", "256,512"]),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_kdtree-jit")).args(args).env(var, "").output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{var}: {stderr}");
        assert!(stderr.contains(&format!("the path is empty (is {var} set to nothing?)")), "{var}: {stderr}");
    }
}

#[test]
fn a_cache_dir_that_is_not_a_private_directory_is_refused_naming_it() {
    let name = W4a16::valid(&Target { arch: Arch(120) })[0].name();
    let compile =
        |dir: &Path| error(&["compile", "--arch", "120", "--filter", &name, "--cache-dir", dir.to_str().unwrap()]);
    let stderr = compile(Path::new("/dev/null"));
    assert!(stderr.contains("cubin cache at /dev/null: is a device, not a directory"), "{stderr}");
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let stderr = compile(open.path());
    assert!(stderr.contains(&format!("cubin cache at {}: may be written by", open.path().display())), "{stderr}");
}

/// `kdtree-jit` with `args`, stdout on a full disk (/dev/full).
fn to_full_disk(args: &[&str]) -> Output {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    Command::new(env!("CARGO_BIN_EXE_kdtree-jit")).args(args).stdout(full).output().unwrap()
}

/// `kdtree-jit` with `args`, stdout a pipe whose reader is gone (`kdtree-jit ... | head -c1`).
fn to_closed_pipe(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kdtree-jit"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_full_stdout_is_an_error_naming_it_and_a_closed_one_ends_quietly() {
    let name = W4a16::valid(&Target { arch: Arch(120) })[0].name();
    let runs: [&[&str]; 5] = [
        &["list", "--arch", "90"],
        &["list", "--arch", "90", "--json"],
        &["render", &name],
        &["compile", "--arch", "120", "--filter", &name, "--no-cache"],
        &["compile", "--arch", "120", "--filter", &name, "--no-cache", "--json"],
    ];
    for args in runs {
        let output = to_full_disk(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("writing to stdout") && stderr.contains("No space left on device"),
            "{args:?}: {stderr}"
        );
        let output = to_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {:?}\n{stderr}", output.status);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
    }
}

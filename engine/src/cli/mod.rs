//! The command line: one module per subcommand.

mod backend;
mod bench;
mod generate;
mod make_drafter;
mod make_model;
mod make_tiny;
mod prompt;
mod serve;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kdtree_engine::EngineError;

/// Greedy (and speculative) decoding of DeepSeek-V3 / Kimi K2-architecture checkpoints.
///
/// Models are Hugging Face-style folders: config.json plus safetensors shards (optionally with
/// model.safetensors.index.json); routed experts may be INT4 (compressed-tensors pack-quantized).
/// Ops run on the deterministic CPU reference backend, or with `--backend cuda` (the default `auto`
/// when a GPU is found) every op runs on the GPU, the INT4 linears with tuned kernels chosen from
/// the tuning DB.
#[derive(Debug, Parser)]
#[command(name = "kdtree-engine", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Generate(generate::GenerateArgs),
    Bench(bench::BenchArgs),
    MakeModel(make_model::MakeModelArgs),
    MakeDrafter(make_drafter::MakeDrafterArgs),
    MakeTiny(make_tiny::MakeTinyArgs),
    Serve(serve::ServeArgs),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        let result = match self.command {
            Command::Generate(args) => generate::run(args),
            Command::Bench(args) => bench::run(args),
            Command::MakeModel(args) => make_model::run(args),
            Command::MakeDrafter(args) => make_drafter::run(args),
            Command::MakeTiny(args) => make_tiny::run(args),
            Command::Serve(args) => serve::run(args),
        };
        result.map_err(name_the_flag)
    }
}

/// The library says what is wrong and what is accepted, but names no flag (it has none): for the
/// errors a flag decides, this adds the flag as context, unless the command already named one where
/// it called the library (`.context("--dtype")`).
fn name_the_flag(e: anyhow::Error) -> anyhow::Error {
    let flag = e.chain().find_map(|cause| match cause.downcast_ref::<EngineError>()? {
        EngineError::ComputeDtype { .. } => Some("--dtype"),
        EngineError::KvDtype { .. } => Some("--kv-dtype (on CUDA the KV cache's dtype follows --dtype)"),
        _ => None,
    });
    match flag {
        Some(flag) if !e.chain().any(|cause| cause.to_string().starts_with("--")) => e.context(flag),
        _ => e,
    }
}

/// [`kdtree_jit::stdout::emit`], a failure naming stdout.
fn emit(text: &str) -> anyhow::Result<()> {
    kdtree_jit::stdout::emit(text).context("writing to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kdtree_engine::registry::ComputeDtype;

    #[test]
    fn the_cli_names_the_flag_the_library_does_not() {
        let refused = || EngineError::ComputeDtype {
            backend: "cuda (H100, sm_90)".into(),
            dtype: ComputeDtype::F16,
            reason: "its kernels take bf16 or f32 activations, not f16".into(),
        };
        assert!(!refused().to_string().contains("--"), "{}", refused());
        // An f16 checkpoint loaded without --dtype: the CLI says which flag chooses another dtype.
        let e = name_the_flag(anyhow::Error::new(refused()).context("loading model"));
        let shown = format!("{e:#}");
        assert!(shown.starts_with("--dtype: loading model: cuda (H100, sm_90) cannot compute in f16"), "{shown}");
        // With --dtype given, the command named it already: once is enough.
        let e = name_the_flag(anyhow::Error::new(refused()).context("loading model").context("--dtype"));
        assert_eq!(format!("{e:#}").matches("--dtype").count(), 1, "{e:#}");
        // Other errors pass as they are.
        let e = name_the_flag(anyhow::anyhow!("something else"));
        assert_eq!(format!("{e:#}"), "something else");
    }
}

//! Rendering: every valid variant of every family that `kdtree-jit list --family` offers renders to
//! source that declares its kernel under the variant's name; templates are embedded.

use std::collections::BTreeSet;
use std::process::Command;

use kdtree_jit::dense16::Dense16;
use kdtree_jit::mla::{MlaAux, MlaDecode};
use kdtree_jit::mla_f32::MlaF32;
use kdtree_jit::w4a16::W4a16;
use kdtree_jit::w4a16::grouped::W4a16Grouped;
use kdtree_jit::w4a16::wgmma::W4a16Wgmma;
use kdtree_jit::{Arch, Error, Target, Variant, render, templates_hash};

/// Renders every variant of `V` valid on `arch`, checking each source; returns their names.
fn render_valid<V: Variant>(arch: Arch) -> BTreeSet<String> {
    let valid = V::valid(&Target { arch });
    for v in &valid {
        let source = render(v).unwrap_or_else(|e| panic!("{e}"));
        // The compile tests check the kernel itself, through ptxas's list of entry functions.
        assert!(source.contains("extern \"C\" __global__"), "{} declares no kernel", v.name());
        assert!(source.contains(&format!(" {}(", v.name())), "{} lacks its function", v.name());
        assert!(!source.contains("{{") && !source.contains("{%"), "{} has unrendered tera", v.name());
    }
    valid.iter().map(Variant::name).collect()
}

/// The variants of the CLI family `family` valid on sm_90 (wgmma's on sm_90a, as the CLI compiles
/// it), rendered; `None` for a family this test does not know.
fn render_family(family: &str) -> Option<BTreeSet<String>> {
    let sm90 = Arch(90);
    Some(match family {
        "tiles" => render_valid::<W4a16>(sm90),
        "wgmma" => render_valid::<W4a16Wgmma>(sm90.specific()),
        "grouped" => render_valid::<W4a16Grouped>(sm90),
        "mla" => render_valid::<MlaDecode>(sm90),
        "mla-aux" => render_valid::<MlaAux>(sm90),
        "mla-f32" => render_valid::<MlaF32>(sm90),
        "dense16" => render_valid::<Dense16>(sm90),
        _ => return None,
    })
}

fn kdtree_jit(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kdtree-jit")).args(args).output().unwrap()
}

/// The families `kdtree-jit list --family` offers, from clap's list of its possible values.
fn offered_families() -> Vec<String> {
    let refused = String::from_utf8(kdtree_jit(&["list", "--family", "?"]).stderr).unwrap();
    let values = refused.split_once("[possible values: ").and_then(|(_, rest)| rest.split_once(']'));
    let (values, _) = values.unwrap_or_else(|| panic!("no possible values in: {refused}"));
    values.split(", ").map(str::to_owned).collect()
}

/// The names of the variants that `kdtree-jit list --family {family}` lists as valid on sm_90.
fn listed(family: &str) -> BTreeSet<String> {
    let output = kdtree_jit(&["list", "--arch", "90", "--family", family, "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let points: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    points.iter().map(|p| p["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn every_family_the_cli_offers_renders_each_valid_variant_under_its_name() {
    let families = offered_families();
    assert!(families.contains(&"tiles".to_owned()), "{families:?}");
    for family in &families {
        let rendered = render_family(family).unwrap_or_else(|| panic!("the CLI offers `{family}`, not rendered here"));
        assert!(!rendered.is_empty(), "{family} has no valid variant on sm_90");
        // The same variants as the CLI lists: each family is rendered through the space it serves.
        assert_eq!(rendered, listed(family), "{family}");
    }
}

#[test]
fn the_templates_are_embedded_and_hashed() {
    let names: Vec<&str> = kdtree_jit::render::templates().iter().map(|(name, _)| *name).collect();
    assert!(names.contains(&"w4a16_mma.cu.tera") && names.contains(&"w4a16_gemv.cu.tera"), "{names:?}");
    let hash = templates_hash();
    assert_eq!(hash.len(), 64);
    assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
}

kdtree_jit::variant_space! {
    space Missing {
        template = "no_such_{width}.cu.tera";
        name = "missing_{width}";
        axes { width: u32 = [4] }
    }
}

#[test]
fn a_missing_template_is_a_render_error_naming_it_and_the_variant() {
    let err = render(&Missing { width: 4 }).unwrap_err();
    match &err {
        Error::Render { template, variant, message } => {
            assert_eq!((template.as_str(), variant.as_str()), ("no_such_4.cu.tera", "missing_4"));
            assert!(message.contains("not found"), "{message}");
        }
        other => panic!("expected a render error, got {other:?}"),
    }
}

//! Rendering: every valid W4A16 variant renders to source that declares its kernel; templates are embedded.

use kdtree_jit::w4a16::W4a16;
use kdtree_jit::{Arch, Error, Target, Variant, render, templates_hash};

#[test]
fn every_valid_variant_renders_its_kernel_under_its_name() {
    let valid = W4a16::valid(&Target { arch: Arch(90) });
    assert!(!valid.is_empty());
    for v in &valid {
        let source = render(v).unwrap_or_else(|e| panic!("{e}"));
        // The compile tests check the kernel itself, through ptxas's list of entry functions.
        assert!(source.contains("extern \"C\" __global__"), "{} declares no kernel", v.name());
        assert!(source.contains(&format!(" {}(", v.name())), "{} lacks its function", v.name());
        assert!(!source.contains("{{") && !source.contains("{%"), "{} has unrendered tera", v.name());
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

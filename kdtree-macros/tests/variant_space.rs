//! `variant_space!` expansions that must compile (and run their assertions) and uses that must fail
//! with an error at the right token.

#[test]
fn variant_space() {
    let t = trybuild::TestCases::new();
    t.pass("tests/variant_space/pass/*.rs");
    t.compile_fail("tests/variant_space/error/*.rs");
}

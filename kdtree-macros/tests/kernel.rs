//! `#[kernel]` signatures that must compile (their launchers typed as declared) and mistakes that must
//! fail with an error at the token that is wrong.

#[test]
fn kernel() {
    let t = trybuild::TestCases::new();
    t.pass("tests/kernel/pass/*.rs");
    t.compile_fail("tests/kernel/error/*.rs");
}

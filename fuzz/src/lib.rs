//! Property-based fuzzing of W4A16 variants against the CPU reference (tests/).

//! Proc macros of kdtree (see the crate README).

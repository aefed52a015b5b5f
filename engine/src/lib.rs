//! The DDTree speculative-decoding engine.

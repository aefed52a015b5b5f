//! Eight signed 4-bit values in one 32-bit word, as compressed-tensors packs them.
//!
//! Checked against compressed-tensors 0.20.1, `compressors/pack_quantized/helpers.py`,
//! `pack_to_int32`: the int8 values get `offset = 1 << (num_bits - 1)` (= 8) added, and
//! element `j` of each run of eight along the last (K) dimension goes to bits `4j..4j+4`
//! of the word (`value_g << bit_offset` with `bit_offset = 4j`); the words are int32.
//! So q = -8 is stored as nibble 0 and q = 7 as nibble 15.

/// Values per packed word.
pub const PER_WORD: usize = 8;
/// The stored nibble is `q + OFFSET`.
pub const OFFSET: i8 = 8;
pub const Q_MIN: i8 = -8;
pub const Q_MAX: i8 = 7;

/// Packs eight values in [-8, 7], element `j` at bits `4j..4j+4`.
pub fn pack_word(q: [i8; PER_WORD]) -> u32 {
    q.iter().enumerate().fold(0u32, |word, (j, &v)| {
        debug_assert!((Q_MIN..=Q_MAX).contains(&v));
        word | (((v + OFFSET) as u32 & 0xF) << (4 * j))
    })
}

/// The inverse of [`pack_word`].
pub fn unpack_word(word: u32) -> [i8; PER_WORD] {
    std::array::from_fn(|j| ((word >> (4 * j)) & 0xF) as i8 - OFFSET)
}

/// Packs a row-major [rows, k] matrix of int4 values (k a multiple of 8) into [rows, k / 8] words.
pub fn pack(q: &[i8]) -> Vec<u32> {
    q.chunks_exact(PER_WORD).map(|c| pack_word(c.try_into().expect("chunks_exact yields 8"))).collect()
}

/// The inverse of [`pack`].
pub fn unpack(words: &[u32]) -> Vec<i8> {
    words.iter().flat_map(|&w| unpack_word(w)).collect()
}

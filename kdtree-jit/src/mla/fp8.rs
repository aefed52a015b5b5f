//! MLA's FP8 cache entries: the latent in e4m3 with a power-of-two scale per 32 values, the rope key
//! in bf16 (FlashMLA's FP8 cache keeps the rope part in bf16 too: it carries the position, and is
//! 64 of 576 values). At Kimi K2's sizes an entry is 512 + 16 + 128 = 656 bytes against bf16's
//! 1152.
//!
//! Entry layout, `[latent e4m3 | latent / 32 scale bytes | pad to 16 bytes | rope bf16]`. A scale
//! byte `b` stands for `2^(b - 127)` (an f32 exponent field), the smallest power of two that puts
//! the group's largest magnitude within e4m3's 448. Because the scale is a power of two and e4m3
//! has 4 significant bits, every dequantized value `e4m3 × 2^(b - 127)` is a bf16 value: attention
//! reads the FP8 cache as the bf16 cache holding those values, with the same kernels' arithmetic,
//! and the CPU reference holds the same values ([`round_entry`]).
//!
//! The encoder rounds to nearest even and saturates to ±448 as PTX's
//! `cvt.rn.satfinite.e4m3x2.f32` does; the kernels' append uses that instruction, so the bytes a
//! GPU writes equal `quantize_entry`'s.

/// Latent values sharing one scale.
pub const GROUP: usize = 32;
/// e4m3's largest finite magnitude.
pub(crate) const E4M3_MAX: f32 = 448.0;
/// e4m3's NaN (`S.1111.111`): also what NaN encodes to.
const NAN: u8 = 0x7f;

/// Bytes of one entry: the latent's codes and scales padded to 16 bytes (the kernels copy entries
/// in 16-byte pieces), then the rope key in bf16. A multiple of 16 when `rope` is a multiple of 8.
pub(crate) fn entry_bytes(latent: usize, rope: usize) -> usize {
    (latent + latent / GROUP).next_multiple_of(16) + 2 * rope
}

/// The e4m3 code nearest to `x` (ties to even), finite values beyond ±448 saturated to ±448.
pub(crate) fn e4m3_from_f32(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return NAN;
    }
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Below 2^-6 the codes are subnormal, multiples of 2^-9; from 2^e up, multiples of 2^(e - 3).
    // Scaling by a power of two is exact, so one rounding happens, and a carry into the next
    // binade lands on that binade's first code.
    let exp = if a < 2f32.powi(-6) { -6 } else { (a.to_bits() >> 23) as i32 - 127 };
    let q = (a * 2f32.powi(3 - exp)).round_ties_even() as i32;
    sign | ((exp + 7) * 8 + q - 8) as u8
}

/// The value of an e4m3 code.
pub(crate) fn e4m3_to_f32(code: u8) -> f32 {
    let (sign, mag) = (if code & 0x80 != 0 { -1.0 } else { 1.0 }, code & 0x7f);
    if mag == NAN {
        return f32::NAN;
    }
    let (exp, mant) = ((mag >> 3) as i32, (mag & 7) as f32);
    sign * if exp == 0 { mant * 2f32.powi(-9) } else { (8.0 + mant) * 2f32.powi(exp - 10) }
}

/// The scale byte of a group whose largest magnitude is `amax`: the least `b` in 1..=254 with `amax
/// <= 448 × 2^(b - 127)` (448 = 1.75 × 2^8, so `b` is amax's exponent field less 8, plus one when
/// its mantissa is over 1.75). Integer work on the bits, which the kernel repeats exactly.
pub(crate) fn scale_byte(amax: f32) -> u8 {
    let bits = amax.to_bits() & 0x7fff_ffff;
    let field = (bits >> 23) as i32;
    let over = i32::from(bits & 0x7f_ffff > 0x60_0000);
    (field - 8 + over).clamp(1, 254) as u8
}

/// The scale a byte stands for, `2^(b - 127)`.
pub(crate) fn scale_of(byte: u8) -> f32 {
    f32::from_bits(u32::from(byte) << 23)
}

/// A group's largest magnitude, NaN ignored (as `fmaxf` does on the GPU).
fn amax(values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// The bytes of the entry `[latent | rope]` (`entry.len() = latent + rope`, `latent` a multiple of
/// [`GROUP`]).
pub(crate) fn quantize_entry(entry: &[f32], latent: usize) -> Vec<u8> {
    let rope = entry.len() - latent;
    let mut out = vec![0u8; entry_bytes(latent, rope)];
    for (g, values) in entry[..latent].chunks(GROUP).enumerate() {
        let byte = scale_byte(amax(values));
        let scale = scale_of(byte);
        for (i, &x) in values.iter().enumerate() {
            out[g * GROUP + i] = e4m3_from_f32(x / scale);
        }
        out[latent + g] = byte;
    }
    let at = out.len() - 2 * rope;
    for (i, &x) in entry[latent..].iter().enumerate() {
        out[at + 2 * i..at + 2 * i + 2].copy_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
    }
    out
}

/// The values an entry's bytes hold, `[latent | rope]`, each rounded to bf16 as the kernels round
/// them (exact but at the edge of bf16's range, where both round to nearest even alike).
pub(crate) fn dequantize_entry(bytes: &[u8], latent: usize, rope: usize) -> Vec<f32> {
    let bf16 = |x: f32| half::bf16::from_f32(x).to_f32();
    let mut out = Vec::with_capacity(latent + rope);
    for i in 0..latent {
        out.push(bf16(e4m3_to_f32(bytes[i]) * scale_of(bytes[latent + i / GROUP])));
    }
    let at = entry_bytes(latent, rope) - 2 * rope;
    out.extend(
        bytes[at..at + 2 * rope].chunks(2).map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
    );
    out
}

/// `entry` as an FP8 cache holds it: quantized and read back.
pub fn round_entry(entry: &mut [f32], latent: usize) {
    let rope = entry.len() - latent;
    let back = dequantize_entry(&quantize_entry(entry, latent), latent, rope);
    entry.copy_from_slice(&back);
}

/// `entries` (`[count, latent + rope]`) quantized into the 16-bit words a cache page holds (bytes in
/// little-endian pairs), and the values they hold.
pub(crate) fn quantize_words(entries: &[f32], latent: usize, rope: usize) -> (Vec<u16>, Vec<f32>) {
    let (mut words, mut values) = (Vec::new(), Vec::with_capacity(entries.len()));
    for entry in entries.chunks(latent + rope) {
        let bytes = quantize_entry(entry, latent);
        values.extend(dequantize_entry(&bytes, latent, rope));
        words.extend(bytes.chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])));
    }
    (words, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite code, with its value.
    fn codes() -> Vec<(u8, f32)> {
        (0..=255u8).map(|c| (c, e4m3_to_f32(c))).filter(|(_, v)| v.is_finite()).collect()
    }

    /// The nearest code by search, ties to the even code (the one whose last bit is 0).
    fn nearest(x: f32) -> u8 {
        let x = x.clamp(-E4M3_MAX, E4M3_MAX);
        let mut best: Option<(u8, f64)> = None;
        for (c, v) in codes() {
            let d = (f64::from(v) - f64::from(x)).abs();
            let better = match best {
                None => true,
                Some((b, bd)) => d < bd || (d == bd && c & 1 == 0 && b & 1 == 1),
            };
            // -0 and +0 are both nearest to 0: keep x's sign.
            if better && !(v == 0.0 && c & 0x80 != (x.is_sign_negative() as u8) << 7) {
                best = Some((c, d));
            }
        }
        best.expect("some code").0
    }

    #[test]
    fn codes_decode_to_e4m3s_values() {
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert_eq!(codes().len(), 254);
    }

    #[test]
    fn every_code_encodes_to_itself_and_midpoints_round_to_even() {
        for (c, v) in codes() {
            if v != 0.0 {
                assert_eq!(e4m3_from_f32(v), c, "{v}");
            }
        }
        let mut xs: Vec<f32> = codes().windows(2).map(|w| (w[0].1 + w[1].1) / 2.0).collect();
        xs.extend([0.0, -0.0, 1e-30, -3e-3, 447.9, 449.0, 464.0, 1e6, -1e30, f32::INFINITY, f32::NEG_INFINITY]);
        let mut seed = 1u64;
        for _ in 0..20_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let m = (seed >> 40) as f32 / (1u64 << 24) as f32;
            let e = ((seed >> 20) % 30) as i32 - 14;
            xs.push(if seed & 1 == 0 { m * 2f32.powi(e) } else { -m * 2f32.powi(e) });
        }
        for x in xs.iter().filter(|x| x.is_finite() || x.is_infinite()) {
            assert_eq!(e4m3_from_f32(*x), nearest(*x), "{x:e}");
        }
        assert_eq!(e4m3_from_f32(f32::NAN), NAN);
    }

    #[test]
    fn the_scale_is_the_least_power_of_two_that_fits_the_group() {
        for amax in [448.0f32, 449.0, 1.0, 1.75, 1.7501, 3e-3, 6e4, 2f32.powi(-110)] {
            let s = scale_of(scale_byte(amax));
            assert!(amax <= E4M3_MAX * s && amax > E4M3_MAX * s / 2.0, "{amax}: {s}");
        }
        assert_eq!(scale_byte(448.0), 127);
        // Below 2^-118 the least scale, 2^-126, binds.
        assert_eq!((scale_byte(0.0), scale_byte(2f32.powi(-120))), (1, 1));
        assert_eq!(scale_byte(f32::INFINITY), 247);
    }

    #[test]
    fn dequantized_values_are_bf16_values_within_e4m3s_step() {
        let (latent, rope) = (64, 16);
        assert_eq!(entry_bytes(512, 64), 656);
        assert_eq!(entry_bytes(latent, rope), 80 + 32);
        let entry: Vec<f32> = (0..latent + rope).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let bytes = quantize_entry(&entry, latent);
        let back = dequantize_entry(&bytes, latent, rope);
        for (g, (x, y)) in entry[..latent].chunks(GROUP).zip(back[..latent].chunks(GROUP)).enumerate() {
            // Half a step: 2^-4 of a normal value, 2^-10 of the scale below e4m3's normals.
            let scale = scale_of(bytes[latent + g]);
            for (a, b) in x.iter().zip(y) {
                assert_eq!(half::bf16::from_f32(*b).to_f32(), *b);
                assert!((a - b).abs() <= a.abs() / 16.0 + scale * 2f32.powi(-10), "{a} {b}");
            }
        }
        for (a, b) in entry[latent..].iter().zip(&back[latent..]) {
            assert_eq!(*b, half::bf16::from_f32(*a).to_f32());
        }
        // Reading back and quantizing again changes no value: compaction re-appends gathered entries.
        let mut again = back.clone();
        round_entry(&mut again, latent);
        assert_eq!(again, back);
        let (words, values) = quantize_words(&[entry.clone(), entry].concat(), latent, rope);
        assert_eq!((words.len(), values.len()), (2 * 56, 2 * (latent + rope)));
        assert_eq!(values[latent + rope..], back[..]);
    }
}

//! The one rounding from `f32` to bf16, and the element types a bf16 product reads.

use half::bf16;

/// `x` rounded to bf16 (its upper 16 bits after rounding), as x86's
/// `vcvtne2ps2bf16` rounds: to nearest, ties to even; a NaN stays a NaN (made
/// quiet); a subnormal `f32` (|x| < 2⁻¹²⁶) becomes a zero of its sign, as the native
/// kernels treat subnormal inputs. Every kernel rounds with this or with that
/// instruction, so all of them multiply the same bf16 values.
#[inline(always)]
pub fn round_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let exponent = bits & 0x7f80_0000;
    if exponent == 0 {
        (bits >> 16) as u16 & 0x8000
    } else if exponent == 0x7f80_0000 {
        // Infinity as it is; a NaN keeps its sign and payload's top bits, made quiet.
        let upper = (bits >> 16) as u16;
        if bits & 0x007f_ffff != 0 {
            upper | 0x0040
        } else {
            upper
        }
    } else {
        let lsb = (bits >> 16) & 1;
        (bits.wrapping_add(0x7fff + lsb) >> 16) as u16
    }
}

/// An element of a bf16 product's operand: an `f32`, rounded to bf16 as the product
/// packs it ([`round_bf16`]), or a bf16 already rounded, taken as it is. Only these
/// two ([`Storage`] says which, for the vector packers that load many at once).
pub trait Bf16Operand: Copy + Send + Sync + 'static {
    /// How the element is stored.
    const STORAGE: Storage;
    /// The bf16 value this element is multiplied as, as bits.
    fn bf16_bits(self) -> u16;
}

/// The storage of a [`Bf16Operand`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
}

impl Bf16Operand for f32 {
    const STORAGE: Storage = Storage::F32;

    #[inline(always)]
    fn bf16_bits(self) -> u16 {
        round_bf16(self)
    }
}

impl Bf16Operand for bf16 {
    const STORAGE: Storage = Storage::Bf16;

    #[inline(always)]
    fn bf16_bits(self) -> u16 {
        self.to_bits()
    }
}

/// The `f32` value of bf16 `bits` (exact: bf16 is `f32`'s upper half).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

#[cfg(test)]
mod tests {
    use super::{bf16_to_f32, round_bf16};

    #[test]
    fn rounds_to_nearest_with_ties_to_even() {
        // bf16 keeps 7 fraction bits: steps of 2⁻⁷ in [1, 2).
        let step = 2f32.powi(-7);
        let cases = [
            (1.0 + 0.25 * step, 1.0),             // below half: down
            (1.0 + 0.75 * step, 1.0 + step),      // above half: up (truncation gives 1)
            (1.0 + 0.5 * step, 1.0),              // tie, even below
            (1.0 + 1.5 * step, 1.0 + 2.0 * step), // tie, even above
            (-(1.0 + 0.75 * step), -(1.0 + step)),
            (f32::MAX, f32::INFINITY), // rounds past the largest bf16
        ];
        for (x, want) in cases {
            assert_eq!(bf16_to_f32(round_bf16(x)), want, "{x:e}");
            // half's conversion (nearest, ties to even) agrees on normal numbers.
            assert_eq!(round_bf16(x), half::bf16::from_f32(x).to_bits(), "{x:e}");
        }
    }

    #[test]
    fn keeps_infinities_and_nans_and_flushes_subnormals() {
        assert_eq!(
            bf16_to_f32(round_bf16(f32::NEG_INFINITY)),
            f32::NEG_INFINITY
        );
        assert!(bf16_to_f32(round_bf16(f32::NAN)).is_nan());
        // A NaN whose payload lies only in the low bits stays a NaN (not infinity).
        assert!(bf16_to_f32(round_bf16(f32::from_bits(0x7f80_0001))).is_nan());
        let tiny = f32::from_bits(0x8000_1234); // negative subnormal
        assert_eq!(round_bf16(tiny), 0x8000);
        assert_eq!(round_bf16(f32::MIN_POSITIVE), 0x0080); // the smallest normal stays
    }
}

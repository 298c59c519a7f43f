//! Branch-free float32 `exp` and `ln` (Cephes' polynomials, about 1 ulp) that the compiler can
//! vectorize over a slice, unlike the C library's calls. Used where a row's every entry needs
//! one: the mass of top-p (`kept.rs`) and the Gumbel noise (`noise.rs`).

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding and subtracting 1.5 * 2^23 rounds a float32 of magnitude below 2^22 to an integer.
const ROUND: f32 = 12_582_912.0;

/// `e^x` for `x <= 0` (0 below -87, so `-inf` gives 0).
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    let c = x.max(-87.0);
    let t = c * LOG2E + ROUND;
    let n = t - ROUND;
    let r = c - n * LN2_HI - n * LN2_LO;
    let z = r * r;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * z
        + r
        + 1.0;
    // n sits in t's low mantissa bits: 2^n from integer arithmetic alone (no float-to-int
    // conversion, whose saturating form does not vectorize).
    let n_int = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let scale = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// `ln(x)` for a positive normal float32.
#[inline(always)]
pub fn ln_positive(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 126) as f32;
    // The mantissa in [0.5, 1).
    let m0 = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let small = m0 < std::f32::consts::FRAC_1_SQRT_2;
    e -= if small { 1.0 } else { 0.0 };
    let m = if small { m0 + m0 - 1.0 } else { m0 - 1.0 };
    let z = m * m;
    let mut y = ((((((((7.037_683_6e-2 * m - 1.151_461e-1) * m + 1.167_699_9e-1) * m
        - 1.242_014_1e-1)
        * m
        + 1.424_932_3e-1)
        * m
        - 1.666_805_8e-1)
        * m
        + 2.000_071_4e-1)
        * m
        - 2.499_999_4e-1)
        * m
        + 3.333_333e-1)
        * m
        * z;
    y += LN2_LO * e;
    y -= 0.5 * z;
    m + y + LN2_HI * e
}

/// `xs[i] = e^(xs[i] - m)` for entries `<= m` (vectorized; compiled for AVX2 where the CPU
/// has it, with the same results: Rust never fuses a multiply and an add on its own).
pub fn exp_shifted(xs: &mut [f32], m: f32) {
    #[inline(always)]
    fn run(xs: &mut [f32], m: f32) {
        xs.iter_mut().for_each(|x| *x = exp_nonpositive(*x - m));
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn wide(xs: &mut [f32], m: f32) {
            run(xs, m)
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { wide(xs, m) };
        }
    }
    run(xs, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_a_few_ulps_of_the_library() {
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        for i in 0..200_000 {
            let x = -(i as f32) * 87.0 / 200_000.0;
            assert!(ulps(exp_nonpositive(x), x.exp()) <= 2, "exp({x})");
            let u = (i as f32 + 0.5) / 200_000.0;
            let (a, b) = (ln_positive(u), u.ln());
            assert!(
                ulps(a, b) <= 2 || (a - b).abs() < 1e-7,
                "ln({u}): {a} vs {b}"
            );
        }
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }
}

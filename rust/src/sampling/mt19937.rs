//! torch's CPU generator (`at::mt19937`, `CPUGeneratorImpl`) as far as the exponential race
//! needs it: the same 32-bit Mersenne Twister, consumed the same way, its state read from and
//! written back to the bytes of `torch.Generator.get_state()` / `set_state()`.
//!
//! torch's CPU `exponential_` on float32 draws, per element in memory order, one
//! `random64()` (two 32-bit outputs, the first one high), keeps its low 53 bits as
//! `u = bits * 2^-53`, and stores `(float)(-log1p(-u))` (`transformation::exponential`).
//! The race needs only the draws of the tokens that can still win, so the stream is advanced
//! block by block (the twist) and tempered only where a draw is used.

/// Words in the state (`MERSENNE_STATE_N`) and the twist's offset (`MERSENNE_STATE_M`).
const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// Byte layout of torch's `CPUGeneratorImplStateLegacy` (what `get_state()` returns, 5,056
/// bytes): `the_initial_seed: u64`, `left: i32`, `seeded: i32`, `next: u64`, `state: [u64;
/// 624]`, then three doubles and an int we leave as they are.
pub const STATE_BYTES: usize = 5056;
const LEFT_AT: usize = 8;
const NEXT_AT: usize = 16;
const WORDS_AT: usize = 24;

/// An error reading a generator's state: the bytes are not torch's CPU layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError(pub String);

/// The generator: `state`, the index of the next word, and `left` exactly as torch keeps them
/// (`operator()` decrements `left` first and twists when it reaches 0).
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    next: usize,
    left: u32,
}

#[inline]
fn twist(u: u32, v: u32) -> u32 {
    let mixed = (u & UPPER_MASK) | (v & LOWER_MASK);
    (mixed >> 1) ^ if v & 1 != 0 { MATRIX_A } else { 0 }
}

/// MT19937's output transform.
#[inline]
pub fn temper(mut y: u32) -> u32 {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c_5680;
    y ^= (y << 15) & 0xefc6_0000;
    y ^ (y >> 18)
}

/// The uniform torch's float exponential uses: the low 53 bits of `hi << 32 | lo`.
#[inline]
pub fn uniform53(hi: u32, lo: u32) -> u64 {
    (((hi as u64) << 32) | lo as u64) & ((1u64 << 53) - 1)
}

/// torch's CPU exponential draw (rate 1) from a 53-bit uniform, rounded to float32.
#[inline]
pub fn exponential_f32(u53: u64) -> f32 {
    let u = u53 as f64 * (1.0 / (1u64 << 53) as f64);
    (-(-u).ln_1p()) as f32
}

impl Mt19937 {
    /// `torch.Generator().manual_seed(seed)` (`init_with_uint32`: the low 32 bits).
    pub fn from_seed(seed: u64) -> Self {
        let mut state = [0u32; N];
        state[0] = seed as u32;
        for j in 1..N {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(j as u32);
        }
        Self {
            state,
            next: 0,
            left: 1,
        }
    }

    /// Reads torch's state bytes.
    pub fn from_torch_state(bytes: &[u8]) -> Result<Self, StateError> {
        if bytes.len() != STATE_BYTES {
            return Err(StateError(format!(
                "a CPU generator state is {STATE_BYTES} bytes, got {}",
                bytes.len()
            )));
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let left = i32::from_le_bytes(bytes[LEFT_AT..LEFT_AT + 4].try_into().unwrap());
        let next = u64_at(NEXT_AT);
        if !(1..=N as i32).contains(&left) || next > N as u64 {
            return Err(StateError(format!(
                "generator state out of range (left {left}, next {next})"
            )));
        }
        let mut state = [0u32; N];
        for (j, w) in state.iter_mut().enumerate() {
            *w = u64_at(WORDS_AT + 8 * j) as u32;
        }
        Ok(Self {
            state,
            next: next as usize,
            left: left as u32,
        })
    }

    /// Writes `left`, `next` and the words into a copy of the bytes it was read from.
    pub fn write_torch_state(&self, bytes: &mut [u8]) {
        bytes[LEFT_AT..LEFT_AT + 4].copy_from_slice(&(self.left as i32).to_le_bytes());
        bytes[NEXT_AT..NEXT_AT + 8].copy_from_slice(&(self.next as u64).to_le_bytes());
        for (j, w) in self.state.iter().enumerate() {
            let at = WORDS_AT + 8 * j;
            bytes[at..at + 8].copy_from_slice(&(*w as u64).to_le_bytes());
        }
    }

    fn next_state(&mut self) {
        let s = &mut self.state;
        for j in 0..N - M {
            s[j] = s[j + M] ^ twist(s[j], s[j + 1]);
        }
        for j in N - M..N - 1 {
            s[j] = s[j + M - N] ^ twist(s[j], s[j + 1]);
        }
        s[N - 1] = s[M - 1] ^ twist(s[N - 1], s[0]);
        self.left = N as u32;
        self.next = 0;
    }

    /// One output, as torch's `operator()`.
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        self.left -= 1;
        if self.left == 0 {
            self.next_state();
        }
        let y = self.state[self.next];
        self.next += 1;
        temper(y)
    }

    /// Consumes `n` outputs without tempering them.
    pub fn skip(&mut self, mut n: u64) {
        while n > 0 {
            let avail = (self.left - 1) as u64;
            if n <= avail {
                self.left -= n as u32;
                self.next += n as usize;
                return;
            }
            n -= avail + 1;
            self.next_state();
            self.next = 1;
        }
    }

    /// The next `out.len()` outputs untempered (apply [`temper`] to use one), as consumed.
    pub fn fill_raw(&mut self, out: &mut [u32]) {
        let mut done = 0;
        while done < out.len() {
            let avail = (self.left - 1) as usize;
            let take = avail.min(out.len() - done);
            out[done..done + take].copy_from_slice(&self.state[self.next..self.next + take]);
            self.left -= take as u32;
            self.next += take;
            done += take;
            if done < out.len() {
                self.next_state();
                out[done] = self.state[0];
                self.next = 1;
                done += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_outputs_of_mt19937() {
        // The published first outputs of MT19937 seeded with 5489 (std::mt19937's default).
        let mut g = Mt19937::from_seed(5489);
        let first: Vec<u32> = (0..3).map(|_| g.next_u32()).collect();
        assert_eq!(first, [3_499_211_612, 581_869_302, 3_890_346_734]);
        let mut g = Mt19937::from_seed(5489);
        g.skip(9_999);
        assert_eq!(g.next_u32(), 4_123_659_995); // the 10,000th output (C++ standard)
    }

    #[test]
    fn skip_and_fill_raw_follow_next_u32() {
        for start in [0u64, 1, 622, 623, 624, 625, 1500] {
            for n in [0usize, 1, 2, 623, 624, 625, 2000] {
                let mut a = Mt19937::from_seed(7);
                a.skip(start);
                let (mut b, mut c) = (a.clone(), a.clone());
                let want: Vec<u32> = (0..n).map(|_| a.next_u32()).collect();
                let mut raw = vec![0u32; n];
                b.fill_raw(&mut raw);
                let got: Vec<u32> = raw.into_iter().map(temper).collect();
                assert_eq!(got, want, "start {start} n {n}");
                c.skip(n as u64);
                let after = a.next_u32();
                assert_eq!(
                    (b.next_u32(), c.next_u32()),
                    (after, after),
                    "start {start} n {n}"
                );
            }
        }
    }
}

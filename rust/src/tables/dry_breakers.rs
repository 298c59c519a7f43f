//! DRY's sequence breakers as one automaton (Aho–Corasick): fed the window's tokens one at a
//! time, it says which breaker occurrences end at the newest token, in O(1) per token whatever
//! the breakers. Checking every breaker that ends with the token instead costs up to
//! `max_dry_sequence_breakers` × 21 comparisons per token (512 breakers of one repeated token
//! over a window of that token), on every token of a new request's window: a stall.
//!
//! DRY needs, at each position, only the most recent head among the breakers ending there (the
//! shortest of them) and its tail: a longer breaker ending at the same position starts earlier,
//! and the most recent head wins (`dry.rs`, `Entry::advance`). So each state keeps the length of
//! the shortest breaker that is a suffix of it.

use std::collections::HashMap;

/// A state of the automaton: the longest breaker prefix that ends at the newest token.
pub type State = u32;

/// The state before any token (and after one that no breaker prefix ends with).
pub const ROOT: State = 0;

pub struct Breakers {
    /// `(state, token)` -> the state one token deeper in the trie of breakers.
    next: HashMap<(State, i64), State>,
    /// Per state: the longest proper suffix that is also a state (the failure link).
    fail: Vec<State>,
    /// Per state: the length of the shortest breaker that is a suffix of it (0: none).
    shortest: Vec<u32>,
}

impl Breakers {
    /// The automaton of `breakers` (each non-empty; duplicates are one). O(their total length).
    pub fn new(breakers: &[Vec<i64>]) -> Self {
        let mut next = HashMap::new();
        let mut parent: Vec<(State, i64)> = vec![(ROOT, 0)];
        let mut depth = vec![0u32];
        let mut shortest = vec![0u32];
        for b in breakers {
            let mut s = ROOT;
            for &t in b {
                s = *next.entry((s, t)).or_insert_with(|| {
                    let id = parent.len() as State;
                    parent.push((s, t));
                    depth.push(depth[s as usize] + 1);
                    shortest.push(0);
                    id
                });
            }
            shortest[s as usize] = b.len() as u32;
        }
        let mut order: Vec<State> = (1..parent.len() as State).collect();
        order.sort_by_key(|&s| depth[s as usize]); // a failure link is always shallower
        let mut m = Breakers {
            next,
            fail: vec![ROOT; parent.len()],
            shortest,
        };
        for s in order {
            let (p, t) = parent[s as usize];
            let f = if p == ROOT {
                ROOT
            } else {
                m.step(m.fail[p as usize], t)
            };
            m.fail[s as usize] = f;
            let (own, inherited) = (m.shortest[s as usize], m.shortest[f as usize]);
            m.shortest[s as usize] = match (own, inherited) {
                (0, x) | (x, 0) => x,
                (x, y) => x.min(y),
            };
        }
        m
    }

    /// The state after `t` (at most 21 failure links: a breaker is at most 21 tokens).
    pub fn step(&self, mut s: State, t: i64) -> State {
        loop {
            if let Some(&n) = self.next.get(&(s, t)) {
                return n;
            }
            if s == ROOT {
                return ROOT;
            }
            s = self.fail[s as usize];
        }
    }

    /// The length of the shortest breaker ending at the token that led to `s` (0: none).
    pub fn shortest(&self, s: State) -> usize {
        self.shortest[s as usize] as usize
    }

    pub fn is_empty(&self) -> bool {
        self.fail.len() == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_shortest_breaker_ending_at_each_token() {
        let breakers = vec![vec![1, 2, 3], vec![2, 3], vec![3, 9], vec![5], vec![2, 3]];
        let m = Breakers::new(&breakers);
        let seq = [1, 2, 3, 9, 5, 1, 2, 2, 3, 4, 3, 9];
        let mut s = ROOT;
        for (i, &t) in seq.iter().enumerate() {
            s = m.step(s, t);
            let want = breakers
                .iter()
                .filter(|b| b.len() <= i + 1 && seq[i + 1 - b.len()..=i] == b[..])
                .map(|b| b.len())
                .min()
                .unwrap_or(0);
            assert_eq!(m.shortest(s), want, "at {i}");
        }
        assert!(Breakers::new(&[]).is_empty());
    }
}

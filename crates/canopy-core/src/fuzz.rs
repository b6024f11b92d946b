//! Seeded input generation for the parsers' property tests (mentions, bundle frontmatter,
//! scripted-harness scripts) and the API fuzz campaign: a small reproducible RNG and a
//! mutator of seed texts. Pure: the caller chooses the seed and how many cases (tests read
//! `CANOPY_FUZZ_CASES` for the long form). Decides nothing about what a parser accepts.

/// xorshift64*: small, seeded, reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Characters parsers treat specially, and some they should never see.
const ALPHABET: &[char] = &[
    'a', 'z', '0', '9', '-', '_', '.', '@', '#', ':', '=', '"', '\'', '[', ']', '{', '}', ',', ' ', '\t', '\n', '\r',
    '\\', '\0', 'é', '😀', '\u{202e}', '>', '*', '/', '|', '+',
];

/// `seed` with 1 to 8 random edits: characters inserted, replaced or deleted, ranges
/// duplicated or dropped, lines swapped. Always valid UTF-8.
pub fn mutate(rng: &mut Rng, seed: &str) -> String {
    let mut chars: Vec<char> = seed.chars().collect();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(chars.len() + 1);
        match rng.below(6) {
            0 => chars.insert(at, *rng.pick(ALPHABET)),
            1 if at < chars.len() => chars[at] = *rng.pick(ALPHABET),
            2 if at < chars.len() => {
                chars.remove(at);
            }
            3 => {
                let end = (at + rng.below(40)).min(chars.len());
                let copy: Vec<char> = chars[at..end].to_vec();
                let to = rng.below(chars.len() + 1);
                chars.splice(to..to, copy);
            }
            4 => {
                let end = (at + rng.below(40)).min(chars.len());
                chars.drain(at..end);
            }
            _ => {
                let text: String = chars.iter().collect();
                let mut lines: Vec<&str> = text.lines().collect();
                if lines.len() > 1 {
                    let (a, b) = (rng.below(lines.len()), rng.below(lines.len()));
                    lines.swap(a, b);
                }
                chars = lines.join("\n").chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_cases() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(mutate(&mut a, "key: value\nother: [a, b]\n"), mutate(&mut b, "key: value\nother: [a, b]\n"));
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}

//! Sets of characters (Unicode scalar values), as GBNF's classes, literals and `.` match
//! them, and the UTF-8 lead bytes that start their characters.

use toktrie::SimpleVob;

/// The largest Unicode scalar value.
const MAX_CHAR: u32 = char::MAX as u32;
/// The UTF-16 surrogates, which are no characters.
const SURROGATES: (u32, u32) = (0xD800, 0xDFFF);

/// A set of characters: sorted, disjoint, non-adjacent inclusive ranges of scalar values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CharSet {
    ranges: Vec<(u32, u32)>,
}

impl CharSet {
    /// Every character (GBNF's `.`).
    pub fn any() -> CharSet {
        CharSet::from_ranges([(0, MAX_CHAR)])
    }

    /// The one character `c`.
    pub fn single(c: char) -> CharSet {
        CharSet::from_ranges([(u32::from(c), u32::from(c))])
    }

    /// The characters of the inclusive code point ranges `ranges`: reversed ranges are
    /// empty, and code points that are no characters (surrogates, past U+10FFFF) are left
    /// out, as llama.cpp can never match them.
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u32, u32)>) -> CharSet {
        let mut clipped = Vec::new();
        for (lo, hi) in ranges {
            let hi = hi.min(MAX_CHAR);
            if lo > hi {
                continue;
            }
            let (s_lo, s_hi) = SURROGATES;
            if lo < s_lo {
                clipped.push((lo, hi.min(s_lo - 1)));
            }
            if hi > s_hi {
                clipped.push((lo.max(s_hi + 1), hi));
            }
        }
        clipped.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(clipped.len());
        for (lo, hi) in clipped {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        // Ranges that only touch across the surrogate gap are one run of characters.
        let mut joined: Vec<(u32, u32)> = Vec::with_capacity(merged.len());
        for (lo, hi) in merged {
            match joined.last_mut() {
                Some(last) if last.1 == SURROGATES.0 - 1 && lo == SURROGATES.1 + 1 => last.1 = hi,
                _ => joined.push((lo, hi)),
            }
        }
        CharSet { ranges: joined }
    }

    /// The characters not in the set.
    pub fn complement(&self) -> CharSet {
        let mut gaps = Vec::with_capacity(self.ranges.len() + 1);
        let mut next = 0u32;
        for &(lo, hi) in &self.ranges {
            if lo > next {
                gaps.push((next, lo - 1));
            }
            next = hi + 1;
        }
        if next <= MAX_CHAR {
            gaps.push((next, MAX_CHAR));
        }
        CharSet::from_ranges(gaps)
    }

    /// Whether no character is in the set.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether the set holds every character.
    pub fn is_any(&self) -> bool {
        *self == CharSet::any()
    }

    /// Whether some character is in both sets.
    pub fn intersects(&self, other: &CharSet) -> bool {
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a, b) = (self.ranges[i], other.ranges[j]);
            if a.1 < b.0 {
                i += 1;
            } else if b.1 < a.0 {
                j += 1;
            } else {
                return true;
            }
        }
        false
    }

    /// The ranges of the set, as characters, lowest first. A range may span the surrogate
    /// gap, which no character fills.
    pub fn ranges(&self) -> impl Iterator<Item = (char, char)> + '_ {
        self.ranges
            .iter()
            .filter_map(|&(lo, hi)| Some((char::from_u32(lo)?, char::from_u32(hi)?)))
    }

    /// The bytes that start the UTF-8 encodings of the set's characters (256 bits).
    pub fn lead_bytes(&self) -> SimpleVob {
        let mut leads = SimpleVob::alloc(256);
        // Within the characters of one encoded length, lead bytes rise with the character.
        let lengths = [
            (0, 0x7F),
            (0x80, 0x7FF),
            (0x800, 0xFFFF),
            (0x1_0000, MAX_CHAR),
        ];
        for &(lo, hi) in &self.ranges {
            for (start, end) in lengths {
                let (a, b) = (lo.max(start), hi.min(end));
                if a <= b {
                    leads.allow_range(lead_byte(a)..=lead_byte(b));
                }
            }
        }
        leads
    }
}

/// The first byte of the UTF-8 encoding of the character `c` (no surrogate).
fn lead_byte(c: u32) -> u32 {
    char::from_u32(c).map_or(0, |c| c.encode_utf8(&mut [0; 4]).as_bytes()[0].into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_merged_clipped_and_complemented() {
        let set = CharSet::from_ranges([(b'c'.into(), b'e'.into()), (b'a'.into(), b'b'.into())]);
        assert_eq!(set.ranges().collect::<Vec<_>>(), [('a', 'e')]);
        let empty = CharSet::from_ranges([]);
        assert_eq!(CharSet::from_ranges([(b'z'.into(), b'a'.into())]), empty);
        assert_eq!(
            CharSet::from_ranges([(0xD800, 0xDFFF)]),
            empty,
            "surrogates"
        );
        assert_eq!(CharSet::from_ranges([(0, 0x11_0000)]), CharSet::any());
        let not_a = CharSet::single('a').complement();
        assert!(!not_a.intersects(&CharSet::single('a')));
        assert!(not_a.intersects(&CharSet::single('\n')));
        assert_eq!(not_a.complement(), CharSet::single('a'));
        assert_eq!(CharSet::any().complement(), empty);
        assert!(CharSet::any().is_any());
    }

    #[test]
    fn lead_bytes_follow_utf8() {
        for c in ['a', 'é', 'ぁ', '😀'] {
            let lead = c.to_string().as_bytes()[0];
            assert_eq!(CharSet::single(c).lead_bytes().to_list(), [u32::from(lead)]);
        }
        let all = CharSet::any().lead_bytes();
        assert!(all.is_allowed(0xF4) && !all.is_allowed(0xF5) && !all.is_allowed(0x80));
    }
}

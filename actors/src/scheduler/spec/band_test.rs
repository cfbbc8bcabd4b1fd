//! The band alarm's test of one comparison: are the drafts at one position of the
//! verifications placed in bands `from..` (side U) accepted less than those placed before
//! (side L), stratum by stratum? A one-sided stratified two-proportion z-test
//! (Mantel-Haenszel weights): over the strata s where both sides have drafts, with n and a
//! a side's drafts and accepted drafts there, `w_s = n_U n_L / (n_U + n_L)`, the difference
//! `D = sum_s w_s (a_U/n_U - a_L/n_L) / W` (`W = sum_s w_s`) and `z = D / SE`. SE is the
//! larger of the binomial error, `sqrt(sum_s w_s^2 p_s (1 - p_s) (1/n_U + 1/n_L)) / W` (p_s
//! the stratum's pooled rate), and the request-clustered one, `sqrt(k/(k-1) sum_i u_i^2)`
//! over the k requests, where `u_i = sum_s ±w_s (a_is - r n_is) / (W n)` sums request i's
//! residuals against its side's rate r in each stratum. The clustered error is there
//! because the drafts of one request are not independent (its prompt sets its
//! acceptance): with the binomial error alone, a few odd requests in one band would look
//! significant. When a comparison is low is [`Thresholds`]' to say; the window and the
//! alarm's streaks are `band_alarm.rs`'s.

/// When a comparison is thin or low (the band alarm's settings of the same names).
#[derive(Clone, Copy, Debug)]
pub(super) struct Thresholds {
    /// Drafts each side needs at the position.
    pub min_proposed: u64,
    /// Requests each side needs at the position.
    pub min_requests: u64,
    /// The z statistic below which a side may be low.
    pub z_below: f64,
    /// The share (0..1) of the lower side's rate the upper side must have lost.
    pub min_drop: f64,
}

/// The drafts at one position on one side of a comparison, in the strata both sides have
/// (or in one band, over every stratum).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Side {
    /// Drafts accepted.
    pub accepted: u64,
    /// Drafts proposed.
    pub proposed: u64,
    /// Requests with drafts at the position.
    pub requests: u64,
}

impl Side {
    /// Accepted over proposed.
    pub fn rate(&self) -> f64 {
        self.accepted as f64 / self.proposed.max(1) as f64
    }
}

/// A position where the bands at and past a boundary accept less than those before it.
#[derive(Clone, Debug, PartialEq)]
pub struct BandLow {
    /// The draft position (0 is the first draft).
    pub position: usize,
    /// The first band of the low side: bands `from..` against bands `..from`.
    pub from: usize,
    /// The drafts of bands `from..`, in the strata both sides have.
    pub low: Side,
    /// The drafts of bands `..from`, in the strata both sides have.
    pub rest: Side,
    /// The stratified difference of the low side's rate from the rest's.
    pub gap: f64,
    /// The share of the rest's rate (at the low side's lengths) that `gap` is.
    pub drop: f64,
    /// The z statistic of `gap`.
    pub z: f64,
    /// Each band's (accepted, proposed) at the position in the window.
    pub per_band: Vec<(u64, u64)>,
}

/// What one comparison found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Verdict {
    /// Too few drafts or requests on a side.
    Thin,
    Fine,
    Low,
}

/// A comparison: (draft position, first band of the upper side).
pub(super) type Key = (usize, usize);

/// One request's drafts in one band and stratum in the window.
#[derive(Default)]
pub(super) struct Cell {
    pub(super) verifications: usize,
    /// Per position: (proposed, accepted).
    pub(super) per_position: Vec<(u64, u64)>,
}

/// Both sides' (proposed, accepted) in one stratum at one position.
#[derive(Clone, Copy, Default)]
struct Stratum {
    upper: (u64, u64),
    lower: (u64, u64),
}

impl Stratum {
    /// Both sides have drafts here.
    fn informative(&self) -> bool {
        self.upper.0 > 0 && self.lower.0 > 0
    }

    /// The Mantel-Haenszel weight.
    fn weight(&self) -> f64 {
        let (nu, nl) = (self.upper.0 as f64, self.lower.0 as f64);
        nu * nl / (nu + nl)
    }

    fn rate((n, a): (u64, u64)) -> f64 {
        a as f64 / n.max(1) as f64
    }
}

/// A cell of the window, its request and stratum as dense indices for one check.
pub(super) struct Placed<'a> {
    pub(super) band: usize,
    pub(super) request: usize,
    pub(super) stratum: usize,
    pub(super) cell: &'a Cell,
}

/// The window's cells as one check sees them.
pub(super) struct Window<'a> {
    pub(super) cells: Vec<Placed<'a>>,
    pub(super) requests: usize,
    pub(super) strata: usize,
    pub(super) bands: usize,
}

impl Window<'_> {
    /// Each cell's (proposed, accepted) at `position`.
    pub(super) fn at(&self, position: usize) -> Vec<(u64, u64)> {
        let at = |c: &Placed| c.cell.per_position.get(position).copied();
        self.cells.iter().map(|c| at(c).unwrap_or((0, 0))).collect()
    }

    /// Per stratum and band (`stratum * bands + band`): the (proposed, accepted) of `at`.
    pub(super) fn sums(&self, at: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let mut sums = vec![(0, 0); self.strata * self.bands];
        for (c, &(n, a)) in self.cells.iter().zip(at) {
            let slot = &mut sums[c.stratum * self.bands + c.band];
            *slot = (slot.0 + n, slot.1 + a);
        }
        sums
    }

    /// The comparison of bands `from..` with bands `..from` at `position`, whose cells
    /// hold `at` ([`Window::at`]) and strata `by_band` ([`Window::sums`]).
    pub(super) fn compare(
        &self,
        t: &Thresholds,
        (position, from): Key,
        at: &[(u64, u64)],
        by_band: &[(u64, u64)],
        per_band: &[(u64, u64)],
    ) -> (Verdict, BandLow) {
        let strata = self.strata(from, by_band);
        let weighted = Weighted::of(&strata);
        let (sides, clustered) = self.clustered(from, at, &strata, weighted.total);
        let [rest, low] = sides;
        let se = weighted.binomial.max(clustered).sqrt();
        let gap = weighted.gap;
        let z = if se > 0.0 { gap / se } else { 0.0 };
        let thin = [low, rest]
            .iter()
            .any(|x| x.proposed < t.min_proposed || x.requests < t.min_requests);
        let verdict = if thin {
            Verdict::Thin
        } else if z < t.z_below && -gap >= t.min_drop * weighted.base {
            Verdict::Low
        } else {
            Verdict::Fine
        };
        let finding = BandLow {
            position,
            from,
            low,
            rest,
            gap,
            drop: if weighted.base > 0.0 {
                -gap / weighted.base
            } else {
                0.0
            },
            z,
            per_band: per_band.to_vec(),
        };
        (verdict, finding)
    }

    /// Each stratum's two sides: bands `from..` (upper) and `..from` (lower).
    fn strata(&self, from: usize, by_band: &[(u64, u64)]) -> Vec<Stratum> {
        let add = |x: (u64, u64), y: &(u64, u64)| (x.0 + y.0, x.1 + y.1);
        by_band
            .chunks(self.bands)
            .map(|bands| Stratum {
                upper: bands[from..].iter().fold((0, 0), add),
                lower: bands[..from].iter().fold((0, 0), add),
            })
            .collect()
    }

    /// Both sides' sums over the strata both have (lower, upper), and the request-clustered
    /// variance of the difference: each request's residuals against its side's rate,
    /// weighted `±w_s / (W n)` in each stratum, squared and summed with `k / (k - 1)`.
    fn clustered(
        &self,
        from: usize,
        at: &[(u64, u64)],
        strata: &[Stratum],
        total: f64,
    ) -> ([Side; 2], f64) {
        // Per stratum and side (lower, upper): the side's rate and the coefficient of a
        // request's residual there, `±w_s / (W n)`; none where the stratum is one-sided.
        let terms: Vec<Option<[(f64, f64); 2]>> = strata
            .iter()
            .map(|x| {
                let w = x.weight() / total;
                let term =
                    |side: (u64, u64), sign: f64| (Stratum::rate(side), sign * w / side.0 as f64);
                x.informative()
                    .then(|| [term(x.lower, -1.0), term(x.upper, 1.0)])
            })
            .collect();
        let mut residuals = vec![0.0; self.requests];
        let mut counted = vec![[false; 2]; self.requests];
        let mut sides = [Side::default(); 2];
        for (c, &(n, a)) in self.cells.iter().zip(at) {
            let Some(term) = &terms[c.stratum] else {
                continue;
            };
            if n == 0 {
                continue;
            }
            let upper = usize::from(c.band >= from);
            let (rate, coefficient) = term[upper];
            let sum = &mut sides[upper];
            sum.proposed += n;
            sum.accepted += a;
            let seen = &mut counted[c.request][upper];
            sum.requests += u64::from(!*seen);
            *seen = true;
            residuals[c.request] += coefficient * (a as f64 - rate * n as f64);
        }
        let k = counted.iter().filter(|c| c[0] || c[1]).count() as f64;
        let clustered = if k > 1.0 {
            k / (k - 1.0) * residuals.iter().map(|u| u * u).sum::<f64>()
        } else {
            0.0
        };
        (sides, clustered)
    }
}

/// The Mantel-Haenszel sums over the strata both sides have, each weight `w_s` over their
/// total `W`: the difference of the rates, the lower side's rate, the binomial variance.
struct Weighted {
    total: f64,
    gap: f64,
    base: f64,
    binomial: f64,
}

impl Weighted {
    fn of(strata: &[Stratum]) -> Weighted {
        let total: f64 = strata
            .iter()
            .filter(|x| x.informative())
            .map(Stratum::weight)
            .sum();
        let (mut gap, mut base, mut binomial) = (0.0, 0.0, 0.0);
        for x in strata.iter().filter(|x| x.informative()) {
            let w = x.weight() / total;
            gap += w * (Stratum::rate(x.upper) - Stratum::rate(x.lower));
            base += w * Stratum::rate(x.lower);
            let pooled = Stratum::rate((x.upper.0 + x.lower.0, x.upper.1 + x.lower.1));
            let (nu, nl) = (x.upper.0 as f64, x.lower.0 as f64);
            binomial += w * w * pooled * (1.0 - pooled) * (1.0 / nu + 1.0 / nl);
        }
        Weighted {
            total,
            gap,
            base,
            binomial,
        }
    }
}

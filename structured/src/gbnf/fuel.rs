//! The bound on the converter's work, so that no grammar keeps it busy for long: the
//! analysis of lexemes is quadratic at worst, and grammars may be a megabyte.

use super::GbnfError;

/// Work units left.
#[derive(Debug)]
pub struct Fuel(u64);

impl Fuel {
    /// `units` of work.
    pub fn new(units: u64) -> Fuel {
        Fuel(units)
    }

    /// Spends `units`; an error once none are left.
    pub fn burn(&mut self, units: usize) -> Result<(), GbnfError> {
        let units = u64::try_from(units).unwrap_or(u64::MAX);
        self.0 = self.0.checked_sub(units).ok_or_else(|| {
            GbnfError("the grammar is too complex to convert to llguidance's syntax".into())
        })?;
        Ok(())
    }
}

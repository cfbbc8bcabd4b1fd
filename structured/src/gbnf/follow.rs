//! Which lexemes a planned grammar may start with and which may come right after each
//! lexeme (the classic FIRST and FOLLOW sets, over lexemes; empty lexemes are seen
//! through, as llguidance makes a lexeme that matches the empty string optional).

use toktrie::SimpleVob;

use super::fuel::Fuel;
use super::plan::{Item, Plan};
use super::GbnfError;

/// The lexemes the grammar may start with and those that may follow each lexeme (sets of
/// lexeme indices).
#[derive(Debug)]
pub struct Follow {
    /// The lexemes that may come first.
    pub start: SimpleVob,
    /// By lexeme: the lexemes that may come right after it.
    pub lexemes: Vec<SimpleVob>,
}

impl Follow {
    /// The sets of `plan`, whose lexemes match the empty string where `nullable` says.
    pub fn of(plan: &Plan, nullable: &[bool], fuel: &mut Fuel) -> Result<Follow, GbnfError> {
        let width = plan.lexemes.len();
        // The sets: of each rule twice, and of each lexeme.
        fuel.burn((2 * plan.rules.len() + width) * (1 + width / 32))?;
        let mut first = First {
            lexeme_nullable: nullable,
            rules: vec![SimpleVob::alloc(width); plan.rules.len()],
            rule_nullable: vec![false; plan.rules.len()],
            width,
        };
        // Each pass walks the whole plan, its sets as wide as the lexemes.
        let pass = (1
            + plan
                .rules
                .iter()
                .map(|rule| size(&rule.body))
                .sum::<usize>()
            + size(&plan.start))
            * (1 + width / 32);
        loop {
            fuel.burn(pass)?;
            let mut changed = false;
            for (index, rule) in plan.rules.iter().enumerate() {
                let (set, nullable) = first.of(&rule.body);
                changed |= grow(&mut first.rules[index], &set);
                if nullable && !first.rule_nullable[index] {
                    first.rule_nullable[index] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let mut walk = Walk {
            first: &first,
            rules: vec![SimpleVob::alloc(width); plan.rules.len()],
            lexemes: vec![SimpleVob::alloc(width); width],
            changed: true,
        };
        while walk.changed {
            fuel.burn(pass)?;
            walk.changed = false;
            walk.item(&plan.start, &SimpleVob::alloc(width));
            for (index, rule) in plan.rules.iter().enumerate() {
                let after = walk.rules[index].clone();
                walk.item(&rule.body, &after);
            }
        }
        Ok(Follow {
            start: first.of(&plan.start).0,
            lexemes: walk.lexemes,
        })
    }
}

/// The FIRST sets of the planned rules, as far as they are known.
struct First<'a> {
    lexeme_nullable: &'a [bool],
    rules: Vec<SimpleVob>,
    rule_nullable: Vec<bool>,
    width: usize,
}

impl First<'_> {
    /// The lexemes `item` may start with, and whether it matches the empty string.
    fn of(&self, item: &Item) -> (SimpleVob, bool) {
        match item {
            Item::Empty => (SimpleVob::alloc(self.width), true),
            Item::Lexeme(lexeme) => {
                let mut set = SimpleVob::alloc(self.width);
                set.set(*lexeme, true);
                (set, self.lexeme_nullable[*lexeme])
            }
            Item::Rule(rule) => (self.rules[*rule].clone(), self.rule_nullable[*rule]),
            Item::Seq(items) => {
                let mut set = SimpleVob::alloc(self.width);
                for item in items {
                    let (first, nullable) = self.of(item);
                    set.or(&first);
                    if !nullable {
                        return (set, false);
                    }
                }
                (set, true)
            }
            Item::Alt(items) => {
                let mut set = SimpleVob::alloc(self.width);
                let mut any_nullable = false;
                for item in items {
                    let (first, nullable) = self.of(item);
                    set.or(&first);
                    any_nullable |= nullable;
                }
                (set, any_nullable)
            }
            Item::Repeat { inner, min, .. } => {
                let (set, nullable) = self.of(inner);
                (set, nullable || *min == 0)
            }
        }
    }
}

/// One pass adding to the FOLLOW sets.
struct Walk<'a, 'b> {
    first: &'a First<'b>,
    /// By planned rule: what may follow it.
    rules: Vec<SimpleVob>,
    /// By lexeme: what may follow it.
    lexemes: Vec<SimpleVob>,
    changed: bool,
}

impl Walk<'_, '_> {
    /// Notes that `after` may follow `item`, and what follows each part of it.
    fn item(&mut self, item: &Item, after: &SimpleVob) {
        match item {
            Item::Empty => {}
            Item::Lexeme(lexeme) => self.changed |= grow(&mut self.lexemes[*lexeme], after),
            Item::Rule(rule) => self.changed |= grow(&mut self.rules[*rule], after),
            Item::Seq(items) => {
                let mut after = after.clone();
                for item in items.iter().rev() {
                    self.item(item, &after);
                    let (first, nullable) = self.first.of(item);
                    if nullable {
                        after.or(&first);
                    } else {
                        after = first;
                    }
                }
            }
            Item::Alt(items) => {
                for item in items {
                    self.item(item, after);
                }
            }
            Item::Repeat { inner, max, .. } => {
                if *max == Some(1) {
                    self.item(inner, after);
                } else {
                    let mut again = after.clone();
                    again.or(&self.first.of(inner).0);
                    self.item(inner, &again);
                }
            }
        }
    }
}

/// Adds `more` to `set`; whether that added something.
fn grow(set: &mut SimpleVob, more: &SimpleVob) -> bool {
    let before = set.num_set();
    set.or(more);
    set.num_set() != before
}

/// How many items `item` holds.
fn size(item: &Item) -> usize {
    match item {
        Item::Seq(items) | Item::Alt(items) => 1 + items.iter().map(size).sum::<usize>(),
        Item::Repeat { inner, .. } => 1 + size(inner),
        _ => 1,
    }
}

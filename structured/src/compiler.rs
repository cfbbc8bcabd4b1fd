//! Grammars compiled once per model and cached by their text: one llguidance
//! `ParserFactory` over the served tokenizer, shared by every request; a compiled grammar
//! is a parser in its start state that each request clones into its own matcher.
//!
//! Compiling is bounded: the text's size first, then llguidance's own limits (lexer fuel,
//! grammar size), then the wall clock: a compile runs on a thread of its own and is given
//! up after `compile_timeout` (the thread finishes within llguidance's fuel, its result
//! dropped). A panic inside llguidance is caught and reported as a bad grammar. Callers
//! compile off the HTTP threads and off the engine's step loop (the gateway's blocking pool).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use llguidance::{Matcher, ParserFactory, TokenParser};
use peregrine_models::tokenizer::Tokenizer;

use crate::constraint::Constraint;
use crate::matcher::GrammarMatcher;
use crate::tokens::token_env;

/// The bounds on compiling and caching grammars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrammarLimits {
    /// The largest constraint text compiled, in bytes.
    pub max_bytes: usize,
    /// How long one compile may take.
    pub compile_timeout: Duration,
    /// How many compiled grammars the cache keeps (least recently used go first).
    pub cache_entries: usize,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        GrammarLimits {
            max_bytes: 1 << 20,
            compile_timeout: Duration::from_secs(10),
            cache_entries: 256,
        }
    }
}

/// Why a constraint was not compiled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The constraint is not valid (llguidance's message, or the converter's).
    #[error("{0}")]
    Invalid(String),
    /// Its text exceeds `max_bytes`.
    #[error(
        "the {kind} is {bytes} bytes, more than the {limit} bytes allowed (--max-grammar-bytes)"
    )]
    TooLarge {
        kind: &'static str,
        bytes: usize,
        limit: usize,
    },
    /// It did not compile within `compile_timeout`.
    #[error("the {kind} did not compile within {} ms (--grammar-compile-timeout)", .timeout.as_millis())]
    TooSlow {
        kind: &'static str,
        timeout: Duration,
    },
}

/// A grammar compiled for the served model: a parser in its start state.
pub struct CompiledGrammar {
    parser: TokenParser,
    kind: &'static str,
    vocab: usize,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl PartialEq for CompiledGrammar {
    /// Two compiled grammars are the same only if they are one object.
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl CompiledGrammar {
    /// A new request's matcher, at the grammar's start.
    pub fn matcher(&self) -> GrammarMatcher {
        GrammarMatcher::new(Matcher::new(Ok(self.parser.clone())), self.vocab, self.kind)
    }

    /// The constraint's kind ([`Constraint::kind`]).
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

/// What a compile did, for metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompileReport {
    /// Found in the cache.
    pub cached: bool,
    /// Time spent compiling (zero when cached).
    pub elapsed: Duration,
}

/// Compiles constraints for one model, caching them by text.
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    vocab: usize,
    limits: GrammarLimits,
    cache: Mutex<Lru>,
}

impl GrammarCompiler {
    /// A compiler over `tokenizer` for logit rows of `logits_width` tokens.
    pub fn new(
        tokenizer: &Tokenizer,
        logits_width: usize,
        limits: GrammarLimits,
    ) -> anyhow::Result<GrammarCompiler> {
        let env = token_env(tokenizer, logits_width)?;
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        // Errors name what is wrong with the grammar, not the parser's whole state.
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
            vocab: logits_width,
            limits,
            cache: Mutex::new(Lru::default()),
        })
    }

    /// The limits it compiles under.
    pub fn limits(&self) -> GrammarLimits {
        self.limits
    }

    /// The width of the masks its matchers compute.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// `constraint` compiled, from the cache where it is there. Blocks for up to the
    /// compile timeout: call it off async threads.
    pub fn compile(
        &self,
        constraint: &Constraint,
    ) -> Result<(Arc<CompiledGrammar>, CompileReport), GrammarError> {
        let kind = constraint.kind();
        let bytes = constraint.text_len();
        if bytes > self.limits.max_bytes {
            return Err(GrammarError::TooLarge {
                kind,
                bytes,
                limit: self.limits.max_bytes,
            });
        }
        let key = constraint.cache_key();
        if let Some(found) = self.cache().get(&key) {
            let report = CompileReport {
                cached: true,
                elapsed: Duration::ZERO,
            };
            return Ok((found, report));
        }
        let started = Instant::now();
        let parser = self.compile_bounded(constraint)?;
        let compiled = Arc::new(CompiledGrammar {
            parser,
            kind,
            vocab: self.vocab,
        });
        self.cache()
            .insert(key, Arc::clone(&compiled), self.limits.cache_entries);
        let report = CompileReport {
            cached: false,
            elapsed: started.elapsed(),
        };
        Ok((compiled, report))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compiles on a thread of its own, waiting at most the compile timeout.
    fn compile_bounded(&self, constraint: &Constraint) -> Result<TokenParser, GrammarError> {
        let kind = constraint.kind();
        let (factory, constraint) = (Arc::clone(&self.factory), constraint.clone());
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("grammar-compile".into())
            .spawn(move || {
                let _ = tx.send(compile_now(&factory, &constraint));
            })
            .map_err(|err| GrammarError::Invalid(format!("cannot start a compile: {err}")))?;
        match rx.recv_timeout(self.limits.compile_timeout) {
            Ok(result) => result,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(GrammarError::TooSlow {
                kind,
                timeout: self.limits.compile_timeout,
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(GrammarError::Invalid(
                "the grammar compiler stopped without an answer".into(),
            )),
        }
    }
}

/// Compiles `constraint` on this thread, a panic caught as an error. The parser is made
/// to compute its first mask here, so that every lexer the grammar needs is built before
/// a request's first step.
fn compile_now(
    factory: &ParserFactory,
    constraint: &Constraint,
) -> Result<TokenParser, GrammarError> {
    let grammar = constraint.grammar().map_err(GrammarError::Invalid)?;
    let compiled = catch_unwind(AssertUnwindSafe(|| {
        let parser = factory.create_parser(grammar)?;
        let mut probe = Matcher::new(Ok(parser.clone()));
        probe.compute_mask()?;
        Ok::<_, anyhow::Error>(parser)
    }));
    match compiled {
        Ok(Ok(parser)) => Ok(parser),
        Ok(Err(err)) => Err(GrammarError::Invalid(format!("{err:#}"))),
        Err(_) => Err(GrammarError::Invalid(format!(
            "the {} could not be compiled (the grammar compiler failed on it)",
            constraint.kind()
        ))),
    }
}

/// A least-recently-used map of compiled grammars.
#[derive(Default)]
struct Lru {
    entries: HashMap<String, (Arc<CompiledGrammar>, u64)>,
    clock: u64,
}

impl Lru {
    fn get(&mut self, key: &str) -> Option<Arc<CompiledGrammar>> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|(grammar, used)| {
            *used = clock;
            Arc::clone(grammar)
        })
    }

    fn insert(&mut self, key: String, grammar: Arc<CompiledGrammar>, capacity: usize) {
        self.clock += 1;
        self.entries.insert(key, (grammar, self.clock));
        while self.entries.len() > capacity.max(1) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| key.clone());
            match oldest {
                Some(key) => self.entries.remove(&key),
                None => break,
            };
        }
    }
}

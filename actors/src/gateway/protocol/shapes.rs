//! `Deserialize` for the request fields that take one of several shapes: a completion's
//! `prompt`, `stop`, and a message's `content`. Unlike `#[serde(untagged)]`, whose error
//! names neither the element nor the shapes, a value of the wrong shape is refused with
//! `expected …, got …`, and an element of a list through the list's own `SeqAccess`, so
//! that the error's path (the API error's `param`) is the element's, like `prompt[1]`.
//!
//! A list's first element decides what the list holds: for a prompt, a string makes it a
//! list of strings, an integer a list of token ids, a list a list of token-id lists.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::request::{Content, ContentPart, Prompt, Stop};

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Shaped(PromptShape).deserialize(deserializer)
    }
}

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Shaped(StopShape).deserialize(deserializer)
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Shaped(ContentShape).deserialize(deserializer)
    }
}

/// What a JSON value turned out to be, for the `got …` of an error.
enum Got<'a> {
    Null,
    Bool(bool),
    Integer(i128),
    Float(f64),
    Text(&'a str),
    List,
    Object,
}

/// The most characters of a refused string that an error quotes.
const QUOTED_CHARS: usize = 40;

impl fmt::Display for Got<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Got::Null => f.write_str("null"),
            Got::Bool(value) => write!(f, "{value}"),
            Got::Integer(value) => write!(f, "{value}"),
            Got::Float(value) => write!(f, "{value:?}"),
            Got::Text(text) if text.chars().count() > QUOTED_CHARS => {
                let head: String = text.chars().take(QUOTED_CHARS).collect();
                write!(f, "the string {head:?}…")
            }
            Got::Text(text) => write!(f, "the string {text:?}"),
            Got::List => f.write_str("a list"),
            Got::Object => f.write_str("an object"),
        }
    }
}

/// One shape a value may take: what it expects, and what it makes of each kind of JSON
/// value; a kind it does not take is refused.
trait Shape<'de>: Sized {
    /// What the shape makes.
    type Value;

    /// What is expected, as in "expected a string or a list of strings".
    const EXPECTED: &'static str;

    fn text<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Err(refuse(Self::EXPECTED, Got::Text(text)))
    }

    fn integer<E: de::Error>(self, value: i128) -> Result<Self::Value, E> {
        Err(refuse(Self::EXPECTED, Got::Integer(value)))
    }

    fn list<A: SeqAccess<'de>>(self, _seq: A) -> Result<Self::Value, A::Error> {
        Err(refuse(Self::EXPECTED, Got::List))
    }
}

/// `expected {expected}, got {got}`.
fn refuse<E: de::Error>(expected: &str, got: Got<'_>) -> E {
    E::custom(format_args!("expected {expected}, got {got}"))
}

/// A [`Shape`] as a seed and a visitor of any JSON value.
struct Shaped<S>(S);

impl<'de, S: Shape<'de>> DeserializeSeed<'de> for Shaped<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, S: Shape<'de>> Visitor<'de> for Shaped<S> {
    type Value = S::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(S::EXPECTED)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<S::Value, E> {
        Err(refuse(S::EXPECTED, Got::Bool(value)))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<S::Value, E> {
        self.0.integer(value.into())
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<S::Value, E> {
        self.0.integer(value.into())
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<S::Value, E> {
        Err(refuse(S::EXPECTED, Got::Float(value)))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<S::Value, E> {
        self.0.text(text)
    }

    fn visit_unit<E: de::Error>(self) -> Result<S::Value, E> {
        Err(refuse(S::EXPECTED, Got::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<S::Value, E> {
        Err(refuse(S::EXPECTED, Got::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<S::Value, A::Error> {
        self.0.list(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<S::Value, A::Error> {
        Err(refuse(S::EXPECTED, Got::Object))
    }
}

/// The rest of `seq`, each element of `shape`.
fn rest<'de, A, S>(
    mut seq: A,
    shape: S,
    mut items: Vec<S::Value>,
) -> Result<Vec<S::Value>, A::Error>
where
    A: SeqAccess<'de>,
    S: Shape<'de> + Copy,
{
    while let Some(item) = seq.next_element_seed(Shaped(shape))? {
        items.push(item);
    }
    Ok(items)
}

/// A string.
#[derive(Clone, Copy)]
struct TextShape;

impl<'de> Shape<'de> for TextShape {
    type Value = String;
    const EXPECTED: &'static str = "a string";

    fn text<E: de::Error>(self, text: &str) -> Result<String, E> {
        Ok(text.to_owned())
    }
}

/// A token id: an integer that fits in a `u32`.
#[derive(Clone, Copy)]
struct TokenShape;

impl<'de> Shape<'de> for TokenShape {
    type Value = u32;
    const EXPECTED: &'static str = "a token id (an integer from 0 to 4294967295)";

    fn integer<E: de::Error>(self, value: i128) -> Result<u32, E> {
        u32::try_from(value).map_err(|_| refuse(Self::EXPECTED, Got::Integer(value)))
    }
}

/// A list of token ids.
#[derive(Clone, Copy)]
struct TokensShape;

impl<'de> Shape<'de> for TokensShape {
    type Value = Vec<u32>;
    const EXPECTED: &'static str = "a list of token ids";

    fn list<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<u32>, A::Error> {
        rest(seq, TokenShape, Vec::new())
    }
}

/// The first element of a list prompt, which decides what the list holds.
#[derive(Clone, Copy)]
struct FirstPromptShape;

/// The first element of a list prompt.
enum FirstPrompt {
    Text(String),
    Token(u32),
    Tokens(Vec<u32>),
}

impl<'de> Shape<'de> for FirstPromptShape {
    type Value = FirstPrompt;
    const EXPECTED: &'static str = "a string, a token id, or a list of token ids";

    fn text<E: de::Error>(self, text: &str) -> Result<FirstPrompt, E> {
        TextShape.text(text).map(FirstPrompt::Text)
    }

    fn integer<E: de::Error>(self, value: i128) -> Result<FirstPrompt, E> {
        TokenShape.integer(value).map(FirstPrompt::Token)
    }

    fn list<A: SeqAccess<'de>>(self, seq: A) -> Result<FirstPrompt, A::Error> {
        TokensShape.list(seq).map(FirstPrompt::Tokens)
    }
}

/// A completion prompt: a string, or a list of strings, token ids, or token-id lists.
struct PromptShape;

impl<'de> Shape<'de> for PromptShape {
    type Value = Prompt;
    const EXPECTED: &'static str =
        "a string, a list of strings, a list of token ids, or a list of lists of token ids";

    fn text<E: de::Error>(self, text: &str) -> Result<Prompt, E> {
        Ok(Prompt::Text(text.to_owned()))
    }

    fn list<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
        Ok(match seq.next_element_seed(Shaped(FirstPromptShape))? {
            // An empty list: refused later as no prompt at all.
            None => Prompt::Texts(Vec::new()),
            Some(FirstPrompt::Text(text)) => Prompt::Texts(rest(seq, TextShape, vec![text])?),
            Some(FirstPrompt::Token(id)) => Prompt::Tokens(rest(seq, TokenShape, vec![id])?),
            Some(FirstPrompt::Tokens(ids)) => {
                Prompt::TokenLists(rest(seq, TokensShape, vec![ids])?)
            }
        })
    }
}

/// `stop`: a string or a list of strings.
struct StopShape;

impl<'de> Shape<'de> for StopShape {
    type Value = Stop;
    const EXPECTED: &'static str = "a string or a list of strings";

    fn text<E: de::Error>(self, text: &str) -> Result<Stop, E> {
        Ok(Stop::One(text.to_owned()))
    }

    fn list<A: SeqAccess<'de>>(self, seq: A) -> Result<Stop, A::Error> {
        rest(seq, TextShape, Vec::new()).map(Stop::Many)
    }
}

/// A message's content: a string or a list of content parts.
struct ContentShape;

impl<'de> Shape<'de> for ContentShape {
    type Value = Content;
    const EXPECTED: &'static str = "a string or a list of content parts";

    fn text<E: de::Error>(self, text: &str) -> Result<Content, E> {
        Ok(Content::Text(text.to_owned()))
    }

    fn list<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
        let mut parts = Vec::new();
        while let Some(part) = seq.next_element::<ContentPart>()? {
            parts.push(part);
        }
        Ok(Content::Parts(parts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parse<T: for<'de> Deserialize<'de>>(value: Value) -> Result<T, (String, String)> {
        serde_path_to_error::deserialize(&value)
            .map_err(|err| (err.path().to_string(), err.inner().to_string()))
    }

    #[test]
    fn prompts_of_every_shape() {
        assert!(matches!(parse(json!("a")), Ok(Prompt::Text(t)) if t == "a"));
        assert!(matches!(parse(json!(["a", "b"])), Ok(Prompt::Texts(t)) if t == ["a", "b"]));
        assert!(matches!(parse(json!([])), Ok(Prompt::Texts(t)) if t.is_empty()));
        let max = u32::MAX;
        assert!(matches!(parse(json!([0, max])), Ok(Prompt::Tokens(t)) if t == [0, max]));
        let lists = parse(json!([[1, 2], [], [3]]));
        assert!(matches!(&lists, Ok(Prompt::TokenLists(t)) if *t == [vec![1, 2], vec![], vec![3]]));
    }

    #[test]
    fn a_bad_element_is_named() {
        let err = parse::<Prompt>(json!([[1], [2, 3, -1]])).unwrap_err();
        let message = "expected a token id (an integer from 0 to 4294967295), got -1";
        assert_eq!(err, ("[1][2]".to_owned(), message.to_owned()));
        let err = parse::<Prompt>(json!([false])).unwrap_err();
        assert_eq!(err.0, "[0]");
        assert!(err.1.ends_with("got false"), "{}", err.1);
        let long = "x".repeat(100);
        let err = parse::<Prompt>(json!([1, long])).unwrap_err();
        let quoted = format!("got the string \"{}\"…", "x".repeat(QUOTED_CHARS));
        assert!(err.1.ends_with(&quoted), "{}", err.1);
    }

    #[test]
    fn stops_and_contents() {
        assert!(matches!(parse(json!("a")), Ok(Stop::One(t)) if t == "a"));
        assert!(matches!(parse(json!(["a"])), Ok(Stop::Many(t)) if t == ["a"]));
        let err = parse::<Stop>(json!(1.0)).unwrap_err();
        assert_eq!(err.1, "expected a string or a list of strings, got 1.0");
        assert!(matches!(parse(json!("a")), Ok(Content::Text(t)) if t == "a"));
        let parts = parse(json!([{"type": "text", "text": "a"}]));
        assert!(matches!(&parts, Ok(Content::Parts(p)) if p[0].text.as_deref() == Some("a")));
        let err = parse::<Content>(json!([{"type": 1}])).unwrap_err();
        assert_eq!(err.0, "[0].type");
    }
}

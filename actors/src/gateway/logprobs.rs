//! Token logprobs in the shapes of the two endpoints.

use super::generation::TokenOut;
use super::protocol::response::{
    ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, TopLogprobs,
};

/// The completions shape. `offset` is where the first token's text starts in the output
/// (in characters); it is advanced past the tokens, for the next chunk of a stream. As in
/// vLLM, each token's alternatives include the token itself.
pub fn completion(tokens: &[TokenOut], offset: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for token in tokens {
        let mut top = token.top.clone();
        if !top.iter().any(|(text, _)| *text == token.text) {
            top.push((token.text.clone(), token.logprob));
        }
        out.tokens.push(token.text.clone());
        out.token_logprobs.push(token.logprob);
        out.top_logprobs.push(TopLogprobs(top));
        out.text_offset.push(*offset);
        *offset += token.text.chars().count();
    }
    out
}

/// The chat shape.
pub fn chat(tokens: &[TokenOut]) -> ChatLogprobs {
    let content = tokens
        .iter()
        .map(|token| ChatTokenLogprob {
            token: token.text.clone(),
            logprob: token.logprob,
            bytes: token.text.as_bytes().to_vec(),
            top_logprobs: token
                .top
                .iter()
                .map(|(text, logprob)| ChatTopLogprob {
                    token: text.clone(),
                    logprob: *logprob,
                    bytes: text.as_bytes().to_vec(),
                })
                .collect(),
        })
        .collect();
    ChatLogprobs { content }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Vec<TokenOut> {
        vec![
            TokenOut {
                text: "hé".into(),
                logprob: -0.5,
                top: vec![("hé".into(), -0.5), ("x".into(), -1.0)],
            },
            TokenOut {
                text: "y".into(),
                logprob: -2.0,
                top: vec![("z".into(), -0.1)],
            },
        ]
    }

    #[test]
    fn completion_shape_tracks_offsets_and_adds_the_chosen_token() {
        let mut offset = 3;
        let out = completion(&tokens(), &mut offset);
        assert_eq!(out.tokens, ["hé", "y"]);
        assert_eq!(out.token_logprobs, [-0.5, -2.0]);
        assert_eq!(out.text_offset, [3, 5]);
        assert_eq!(offset, 6);
        assert_eq!(out.top_logprobs[0].0.len(), 2);
        assert_eq!(
            out.top_logprobs[1].0,
            [("z".to_owned(), -0.1), ("y".to_owned(), -2.0)]
        );
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(
            json["top_logprobs"][1],
            serde_json::json!({"z": -0.1f32, "y": -2.0})
        );
    }

    #[test]
    fn chat_shape_has_bytes() {
        let out = chat(&tokens());
        assert_eq!(out.content[0].bytes, "hé".as_bytes());
        assert_eq!(out.content[0].top_logprobs.len(), 2);
        assert_eq!(out.content[1].top_logprobs[0].token, "z");
    }
}

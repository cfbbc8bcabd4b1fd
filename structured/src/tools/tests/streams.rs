//! Streams: random outputs read whole and streamed split every way agree, text that may
//! begin a marker is held back, and arguments stream as they arrive.

use super::super::{parse, ToolCallFormat, ToolCallStream, ToolDelta};
use super::generate::{garbage, output};
use super::{assert_stream_matches_parse, rebuild, rng, stream_at};

#[test]
fn random_well_formed_outputs_read_back_split_anywhere() {
    let mut rng = rng("random_well_formed_outputs");
    for format in ToolCallFormat::ALL {
        for round in 0..120 {
            let generated = output(format, &mut rng);
            let parsed = parse(format, &generated.text);
            let calls: Vec<(String, String)> = parsed
                .calls
                .iter()
                .map(|call| (call.name.clone(), call.arguments.clone()))
                .collect();
            assert_eq!(
                parsed.content, generated.content,
                "{format:?} {:?}",
                generated.text
            );
            assert_eq!(calls, generated.calls, "{format:?} {:?}", generated.text);
            assert!(
                parsed.calls.iter().all(|call| call.complete),
                "{:?}",
                generated.text
            );
            for call in &parsed.calls {
                let arguments: serde_json::Value = serde_json::from_str(&call.arguments)
                    .unwrap_or_else(|err| panic!("{:?}: {err}", call.arguments));
                assert!(arguments.is_object());
            }
            if round % 4 == 0 {
                assert_stream_matches_parse(format, &generated.text, &mut rng);
            } else {
                let cuts = super::random_cuts(&generated.text, &mut rng);
                let (deltas, streamed) = stream_at(format, &generated.text, &cuts);
                assert_eq!(
                    streamed, parsed,
                    "{format:?} {:?} cut at {cuts:?}",
                    generated.text
                );
                assert_eq!(rebuild(&deltas), (parsed.content.clone(), calls));
            }
        }
    }
}

#[test]
fn random_garbage_reads_the_same_whole_and_streamed() {
    let mut rng = rng("random_garbage");
    for format in ToolCallFormat::ALL {
        for _ in 0..400 {
            let text = garbage(&mut rng);
            assert_stream_matches_parse(format, &text, &mut rng);
            for call in parse(format, &text)
                .calls
                .iter()
                .filter(|call| call.complete)
            {
                let arguments: serde_json::Value = serde_json::from_str(&call.arguments)
                    .unwrap_or_else(|err| panic!("{text:?} gave {:?}: {err}", call.arguments));
                assert!(arguments.is_object());
                assert!(!call.name.is_empty());
            }
        }
    }
}

#[test]
fn text_that_may_begin_a_marker_is_held_back() {
    let mut stream = ToolCallStream::new(ToolCallFormat::Hermes);
    assert_eq!(
        stream.push("Hello <tool_"),
        [ToolDelta::Content("Hello ".into())]
    );
    assert_eq!(
        stream.push("box> and <"),
        [ToolDelta::Content("<tool_box> and ".into())]
    );
    assert_eq!(stream.push("b"), [ToolDelta::Content("<b".into())]);
    assert_eq!(stream.push(" <tool"), [ToolDelta::Content(" ".into())]);
    assert_eq!(stream.finish(), [ToolDelta::Content("<tool".into())]);

    let mut stream = ToolCallStream::new(ToolCallFormat::DeepSeekV3);
    assert_eq!(
        stream.push("Hi\n<｜tool▁calls"),
        [ToolDelta::Content("Hi\n".into())]
    );
    assert_eq!(
        stream.push("▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n"),
        []
    );
    assert_eq!(
        stream.push("```json\n{\"a\": 1"),
        [
            ToolDelta::CallStart {
                index: 0,
                name: "f".into()
            },
            ToolDelta::Arguments {
                index: 0,
                fragment: "{\"a\":1".into()
            }
        ]
    );
    // `1` may go on (`12`); `}` ends the number and the object.
    assert_eq!(
        stream.push("}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        [ToolDelta::Arguments {
            index: 0,
            fragment: "}".into()
        }]
    );
    assert_eq!(stream.finish(), []);
    assert_eq!(stream.parsed().content.as_deref(), Some("Hi\n"));

    // Whitespace before a call is held until it is known not to be content.
    let mut stream = ToolCallStream::new(ToolCallFormat::Llama3Json);
    assert_eq!(stream.push("\n "), []);
    assert_eq!(stream.push("Hi"), [ToolDelta::Content("\n Hi".into())]);
}

#[test]
fn arguments_stream_as_they_arrive() {
    let mut stream = ToolCallStream::new(ToolCallFormat::Hermes);
    assert_eq!(stream.push("<tool_call>\n{\"name\": \"get_wea"), []);
    assert_eq!(
        stream.push("ther\", \"arguments\": {\"city\": \"Par"),
        [
            ToolDelta::CallStart {
                index: 0,
                name: "get_weather".into()
            },
            ToolDelta::Arguments {
                index: 0,
                fragment: "{\"city\":\"Par".into()
            }
        ]
    );
    assert_eq!(
        stream.push("is\", \"days\": [1,\n 2]}"),
        [ToolDelta::Arguments {
            index: 0,
            fragment: "is\",\"days\":[1,2]}".into()
        }]
    );
    assert_eq!(stream.push("}\n</tool_call>"), []);
    assert_eq!(stream.finish(), []);

    // Read character by character, a call's arguments come a character at a time (all at
    // once only where the model wrote them before the name, which they wait for).
    let mut rng = rng("arguments_stream_as_they_arrive");
    for format in ToolCallFormat::ALL {
        let mut streamed = 0;
        for _ in 0..40 {
            let generated = output(format, &mut rng);
            let mut stream = ToolCallStream::new(format);
            let mut fragments = vec![0; generated.calls.len()];
            for c in generated.text.chars() {
                for delta in stream.push(&c.to_string()) {
                    if let ToolDelta::Arguments { index, .. } = delta {
                        fragments[index] += 1;
                    }
                }
            }
            stream.finish();
            for ((_, arguments), fragments) in generated.calls.iter().zip(fragments) {
                let chars = arguments.chars().count();
                assert!(fragments == chars || fragments == 1, "{:?}", generated.text);
                streamed += usize::from(fragments == chars && chars > 1);
            }
        }
        assert!(streamed > 0, "{format:?}: no call streamed its arguments");
    }
}

#[test]
fn a_long_region_without_a_call_is_let_go_as_text() {
    let long = format!("<tool_call>{{\"x\": \"{}\"}}", "a".repeat(40_000));
    let mut stream = ToolCallStream::new(ToolCallFormat::Hermes);
    let streamed: usize = stream
        .push(&long)
        .iter()
        .map(|delta| match delta {
            ToolDelta::Content(text) => text.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(streamed, long.len(), "passed on before the output ends");
    assert_eq!(stream.finish(), []);
    assert_eq!(stream.parsed().content.as_deref(), Some(long.as_str()));
    // The gateway keeps a stream across await points.
    fn is_send<T: Send>(_: &T) {}
    is_send(&stream);
}

//! Progress bars for the slow steps of getting a model ready (fetch, conversion, weight
//! loading, and the engine's graph capture), all of one look:
//! `<what> {bar:30} {pos}/{len} <unit> {msg}`.
//!
//! Every bar draws to stderr through indicatif's default target, which draws nothing when
//! stderr is not a terminal (or `TERM` is unset or `dumb`), so logs, pipes and tests get no
//! bar output.

use std::borrow::Cow;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tracing::info;

/// How often a spinner redraws itself while nothing else moves it.
const SPINNER_TICK: Duration = Duration::from_millis(100);

/// A bar over `len` steps of `unit`s, drawn as `<prefix> {bar:30} {pos}/{len} <unit> {msg}`.
pub fn bar(len: u64, prefix: &str, unit: &str) -> ProgressBar {
    styled(ProgressBar::new(len), &bar_template(prefix, unit))
}

/// A bar over `len` bytes, drawn as `<prefix> {bar:30} {bytes}/{total_bytes} {msg}`.
pub fn bytes_bar(len: u64, prefix: &str) -> ProgressBar {
    styled(ProgressBar::new(len), &bytes_template(prefix))
}

/// A spinner showing `msg` and the time taken so far, ticking on its own (only while it is
/// drawn) until finished.
pub fn spinner(msg: impl Into<Cow<'static, str>>) -> ProgressBar {
    let spinner = styled(ProgressBar::new_spinner(), SPINNER_TEMPLATE);
    spinner.set_message(msg);
    if !spinner.is_hidden() {
        spinner.enable_steady_tick(SPINNER_TICK);
    }
    spinner
}

/// Clears `bar` and logs `done` with the seconds since the bar was made.
pub fn finish(bar: &ProgressBar, done: &str) {
    bar.finish_and_clear();
    info!(seconds = bar.elapsed().as_secs_f64(), "{done}");
}

/// The template of [`bar`].
fn bar_template(prefix: &str, unit: &str) -> String {
    format!(
        "{} {{bar:30}} {{pos}}/{{len}} {} {{msg}}",
        literal(prefix),
        literal(unit)
    )
}

/// The template of [`bytes_bar`].
fn bytes_template(prefix: &str) -> String {
    format!(
        "{} {{bar:30}} {{bytes}}/{{total_bytes}} {{msg}}",
        literal(prefix)
    )
}

/// The template of [`spinner`].
const SPINNER_TEMPLATE: &str = "{spinner} {msg} ({elapsed})";

/// `bar` with the style of `template`, kept as it is should the template not parse.
fn styled(bar: ProgressBar, template: &str) -> ProgressBar {
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

/// `text` escaped to stand for itself in a template.
fn literal(text: &str) -> String {
    text.replace('{', "{{").replace('}', "}}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IsTerminal;

    #[test]
    fn templates_parse() {
        assert_eq!(
            bar_template("capturing graphs", "batch"),
            "capturing graphs {bar:30} {pos}/{len} batch {msg}"
        );
        assert_eq!(literal("a {b}"), "a {{b}}");
        for template in [
            bar_template("loading {weights}", "layers"),
            bytes_template("extracting}"),
            SPINNER_TEMPLATE.to_string(),
        ] {
            assert!(
                ProgressStyle::with_template(&template).is_ok(),
                "{template}"
            );
        }
    }

    #[test]
    fn nothing_is_drawn_off_a_terminal() {
        if std::io::stderr().is_terminal() {
            return;
        }
        assert!(bar(3, "loading {weights}", "layers").is_hidden());
        assert!(bytes_bar(3, "extracting").is_hidden());
        let spinner = spinner("downloading");
        assert!(spinner.is_hidden());
        finish(&spinner, "downloaded");
        assert!(spinner.is_finished());
    }
}

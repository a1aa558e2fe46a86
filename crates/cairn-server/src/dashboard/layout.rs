//! The page shell and the small pieces every page uses: times, statuses, values, flashes.

use cairn::{InstanceStatus, Timestamp};
use maud::{DOCTYPE, Markup, html};

/// What the shell needs to know about the page and the viewer.
pub(crate) struct Shell<'a> {
    pub(crate) title: &'a str,
    /// `overview` or `instances`: the nav entry shown as current.
    pub(crate) section: &'a str,
    /// The viewer's CSRF token (for the logout form).
    pub(crate) csrf: &'a str,
    /// A token is set: show the logout button.
    pub(crate) logged_in: bool,
}

/// A full page: head, nav, `body`.
pub(crate) fn page(shell: &Shell<'_>, body: Markup) -> Markup {
    let current = |s: &str| {
        if shell.section == s {
            Some("page")
        } else {
            None
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(shell.title))
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href="/" { "Cairn" }
                    nav aria-label="Main" {
                        a href="/" aria-current=[current("overview")] { "Workflows" }
                        a href="/instances" aria-current=[current("instances")] { "Instances" }
                        // Everything that failed, newest first, across workflows.
                        a href="/instances?status=errored" { "Failures" }
                        a href="/api/openapi.json" { "API" }
                    }
                    @if let Some(caller) = crate::auth::caller() {
                        span.who title="The token this session logged in with, and what it may do" {
                            (caller.name) " · " (caller.scope)
                        }
                    }
                    @if shell.logged_in {
                        form.logout method="post" action="/logout" {
                            input type="hidden" name="csrf" value=(shell.csrf);
                            button.link type="submit" { "Log out" }
                        }
                    }
                }
                main #main { (body) }
            }
        }
    }
}

/// A page without nav (login, errors).
pub(crate) fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { (body) }
        }
    }
}

/// A page that only says something (an error).
pub(crate) fn message_page(title: &str, message: &str) -> Markup {
    bare(
        title,
        html! {
            main.login {
                h1 { "Cairn" }
                p.flash.error role="alert" { (message) }
                p { a href="/" { "Back to the dashboard" } }
            }
        },
    )
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            meta name="color-scheme" content="light dark";
            title { (title) " · Cairn" }
            link rel="icon" href="/assets/icon.svg" type="image/svg+xml";
            link rel="stylesheet" href="/assets/app.css";
            script src="/assets/app.js" defer {}
        }
    }
}

/// A time: UTC in the page, the viewer's local time once the script runs, UTC on hover.
pub(crate) fn time(at: Timestamp) -> Markup {
    let iso = at.to_rfc3339();
    html! { time datetime=(iso) title=(format!("{iso} (UTC)")) { (iso) } }
}

/// An optional time, `—` when absent.
pub(crate) fn maybe_time(at: Option<Timestamp>) -> Markup {
    match at {
        Some(at) => time(at),
        None => html! { span.muted { "—" } },
    }
}

/// A status as a coloured badge.
pub(crate) fn status(status: InstanceStatus) -> Markup {
    html! { span class=(format!("badge s-{}", status.as_str())) { (status.as_str()) } }
}

/// A duration in words: `850 ms`, `12.4 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`.
pub(crate) fn duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        _ if ms < 1_000 => format!("{ms} ms"),
        0..60 => format!("{:.1} s", d.as_secs_f64()),
        60..3_600 => format!("{} min {} s", s / 60, s % 60),
        3_600..86_400 => format!("{} h {} min", s / 3_600, (s % 3_600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3_600),
    }
}

/// The most of a value a page shows before "show all".
pub(crate) const SHOWN_BYTES: usize = 4 * 1024;

/// A JSON value, pretty-printed, cut at [`SHOWN_BYTES`] with a link to all of it.
pub(crate) fn value(value: &serde_json::Value, full_link: Option<&str>, full: bool) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    if full || text.len() <= SHOWN_BYTES {
        return html! { pre.value { (text) } };
    }
    let mut end = SHOWN_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    html! {
        pre.value { (&text[..end]) "…" }
        p.truncated {
            "Showing " (SHOWN_BYTES / 1024) " KiB of " (human_bytes(text.len())) ". "
            @if let Some(link) = full_link { a href=(link) { "Show all" } }
        }
    }
}

/// `text` cut to at most `max` bytes (on a character boundary), with `…` when cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `n` bytes in words.
pub(crate) fn human_bytes(n: usize) -> String {
    match n {
        0..1_024 => format!("{n} bytes"),
        1_024..1_048_576 => format!("{:.1} KiB", n as f64 / 1_024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// The outcome of the last action (`?flash=<id>`, shown once), if any.
pub(crate) fn flash(guard: &super::Guard, pairs: &[(String, String)]) -> Markup {
    let outcome = super::value(pairs, "flash").and_then(|id| guard.take_flash(id));
    html! {
        @match outcome {
            Some(Ok(msg)) => p.flash.ok role="status" { (msg) },
            Some(Err(err)) => p.flash.error role="alert" { (err) },
            None => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_read_well() {
        assert_eq!(super::duration(Duration::from_millis(850)), "850 ms");
        assert_eq!(super::duration(Duration::from_millis(12_400)), "12.4 s");
        assert_eq!(super::duration(Duration::from_secs(185)), "3 min 5 s");
        assert_eq!(super::duration(Duration::from_secs(7_800)), "2 h 10 min");
        assert_eq!(
            super::duration(Duration::from_secs(3 * 86_400 + 4 * 3_600)),
            "3 d 4 h"
        );
    }

    #[test]
    fn a_large_value_is_cut_with_a_link_to_all_of_it() {
        let big = serde_json::json!("x".repeat(10_000));
        let shown = super::value(&big, Some("?full=output"), false).into_string();
        assert!(shown.contains("Show all"));
        assert!(shown.len() < 6_000);
        let all = super::value(&big, Some("?full=output"), true).into_string();
        assert!(all.len() > 10_000);
    }
}

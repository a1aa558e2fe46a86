//! Where a request comes from, as its headers tell: the checks that keep web pages on
//! other sites (and DNS rebinding) away from a server without a token, and from changing
//! anything through the dashboard's forms or a worker's connection.

use axum::http::{HeaderMap, header};

/// Whether the browser says this request comes from another site.
pub(crate) fn cross_site(headers: &HeaderMap) -> bool {
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if let Some(site) = fetch_site {
        return !matches!(site, "same-origin" | "none");
    }
    // Older browsers: an Origin that is not this host.
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match (origin, host) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => origin.split_once("://").map(|(_, h)| h) != Some(host),
        // An origin with nothing to compare it with (HTTP/2 names the host in the
        // request's authority, not a header): not known to be this site.
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Whether `host` (a `Host` header) names the loopback interface.
pub(crate) fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    // Host names are case-insensitive and may end with the root's dot.
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue, header};

    use super::*;

    #[test]
    fn loopback_hosts_are_recognised() {
        for host in [
            "127.0.0.1:8787",
            "localhost:8787",
            "localhost",
            "[::1]:8787",
            "127.0.0.1",
            "localhost.:8787",
            "LOCALHOST",
            "[::ffff:127.0.0.1]:8787",
        ] {
            assert!(loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:8787",
            "10.0.0.1:8787",
            "localhost.evil.example",
            "",
        ] {
            assert!(!loopback_host(host), "{host}");
        }
    }

    #[test]
    fn a_cross_site_post_is_recognised() {
        let mut headers = HeaderMap::new();
        headers.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_site(&headers));
        let mut headers = HeaderMap::new();
        headers.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(!cross_site(&headers));
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8787"));
        assert!(cross_site(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8787"),
        );
        assert!(!cross_site(&headers));
    }
}

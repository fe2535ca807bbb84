//! One TLS set-up for every outbound HTTP client. A `reqwest` client otherwise reads and
//! parses the system's CA roots when it is built: milliseconds apiece, at every cold start.

use std::sync::{Arc, OnceLock};

use rustls_platform_verifier::BuilderVerifierExt;

/// A client builder whose TLS trusts the platform's roots, read once per process.
pub(crate) fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    match shared() {
        Some(config) => builder.tls_backend_preconfigured(config.clone()),
        // reqwest then builds its own, and `build()` reports what is wrong.
        None => builder,
    }
}

fn shared() -> Option<&'static rustls::ClientConfig> {
    static CONFIG: OnceLock<Option<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .ok()?
                .with_platform_verifier()
                .ok()?
                .with_no_client_auth();
            // Our clients speak HTTP/1.1 only (reqwest is built without HTTP/2).
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some(config)
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roots_are_read_once_and_clients_build_on_them() {
        let first = shared().expect("platform roots") as *const _;
        assert_eq!(first, shared().unwrap() as *const _);
        for _ in 0..3 {
            client_builder().build().expect("client");
        }
    }
}

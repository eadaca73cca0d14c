//! The API key: with `--api-key`, every API route answers only a request whose
//! `Authorization` header is `Bearer KEY`, compared in constant time, and a 401 in
//! OpenAI's form otherwise. The page and `/health` stay open (a load balancer's
//! probe carries no key; the page asks for it).

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The environment variable that gives the key when `--api-key` does not.
pub const API_KEY_ENV: &str = "TINYLM_API_KEY";

/// The key clients must send.
pub struct ApiKey(Vec<u8>);

impl ApiKey {
    /// A key of visible ASCII characters (what a header can carry), at least one.
    pub fn new(key: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic()),
            "the API key must be visible ASCII characters (no spaces), at least one"
        );
        Ok(ApiKey(key.as_bytes().to_vec()))
    }

    /// Whether `headers` carry `Authorization: Bearer KEY`. The key's bytes are
    /// compared in constant time (a wrong key of the right length takes as long
    /// whichever byte differs).
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes();
        let scheme = b"bearer ";
        if value.len() < scheme.len() || !value[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return false;
        }
        let given = value[scheme.len()..].trim_ascii();
        given.ct_eq(&self.0).into()
    }
}

/// The middleware of the API's routes: the request goes on only with the key.
pub async fn require(State(key): State<Arc<ApiKey>>, request: Request, next: Next) -> Response {
    if key.accepts(request.headers()) {
        return next.run(request).await;
    }
    let message = match request.headers().contains_key(AUTHORIZATION) {
        true => "Incorrect API key provided: send the server's key as `Authorization: Bearer KEY`",
        false => {
            "You didn't provide an API key: send the server's key as `Authorization: Bearer KEY`"
        }
    };
    ApiError::unauthorized(message).into_response()
}

/// Whether a server listening on `ip` can be reached from other machines.
pub fn beyond_loopback(ip: IpAddr) -> bool {
    !ip.is_loopback()
}

/// What a server without a key says at start when it listens beyond loopback.
pub fn open_warning(address: &str) -> String {
    let rule = "!".repeat(78);
    format!(
        "{rule}\nWARNING: listening on {address} without an API key: anyone who can reach this port\ncan use the model. Pass --api-key KEY (or set {API_KEY_ENV}) or listen on 127.0.0.1.\n{rule}"
    )
}

#[cfg(test)]
mod tests {
    use super::{beyond_loopback, ApiKey};
    use axum::http::{HeaderMap, HeaderValue};

    fn with(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn only_the_bearer_key_passes() {
        let key = ApiKey::new("s3cret-key").unwrap();
        assert!(key.accepts(&with("Bearer s3cret-key")));
        assert!(key.accepts(&with("bearer s3cret-key")));
        for wrong in [
            "Bearer s3cret-kez",
            "Bearer s3cret-key2",
            "Bearer s3cret-ke",
            "Bearer ",
            "Basic s3cret-key",
            "s3cret-key",
            "",
        ] {
            assert!(!key.accepts(&with(wrong)), "{wrong}");
        }
        assert!(!key.accepts(&HeaderMap::new()));
        assert!(ApiKey::new("").is_err() && ApiKey::new("a b").is_err());
    }

    #[test]
    fn only_loopback_addresses_are_private() {
        for (ip, beyond) in [
            ("127.0.0.1", false),
            ("::1", false),
            ("0.0.0.0", true),
            ("::", true),
            ("192.168.1.5", true),
        ] {
            assert_eq!(beyond_loopback(ip.parse().unwrap()), beyond, "{ip}");
        }
    }
}

//! [`OAuth2Source`]: a [`TokenSource`] for the OAuth 2.0 client-credentials grant
//! (RFC 6749 §4.4) and the refresh-token grant (§6). Feature `oauth2`.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use reqwest::Url;
use serde_json::Value;

use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::token::{AccessToken, TokenSource};

/// Token responses larger than this are refused: a token endpoint answers a few hundred
/// bytes, and a misconfigured URL must not make the client buffer a whole page.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Fetches tokens from an OAuth 2.0 token endpoint.
///
/// - [`OAuth2Source::client_credentials`]: a service's own identity (RFC 6749 §4.4).
/// - [`OAuth2Source::refresh_token`]: a user's delegated access from a refresh token
///   (§6); when the server rotates the refresh token, the new one is used next time.
///
/// The token's expiry is `expires_in` seconds after the response arrived (no expiry when
/// the server omits it). Error responses (§5.2) become [`OAuth2Error::Server`] with the
/// error code. The client secret and the refresh token never appear in `Debug` or errors.
///
/// The endpoint must be `https` (plain `http` only on loopback, after
/// [`OAuth2SourceBuilder::allow_http_on_loopback`]). Pass the `reqwest::Client` with your
/// TLS backend through [`OAuth2SourceBuilder::http_client`]; it is used as is, outside any
/// middleware. Bound the fetch with the `TokenManager`'s fetch timeout.
///
/// ```no_run
/// use reqwest_resilience::auth::OAuth2Source;
/// use reqwest_resilience::{BearerAuth, Origin, TokenManager};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let source = OAuth2Source::client_credentials(
///     "https://login.example.com/oauth2/token",
///     "my-service",
///     std::env::var("CLIENT_SECRET")?,
/// )
/// .scope("orders.read orders.write")
/// .build()?;
/// let auth = BearerAuth::builder(TokenManager::new(source))
///     .origin(Origin::parse("https://api.example.com")?)
///     .build()?;
/// # drop(auth); Ok(()) }
/// ```
pub struct OAuth2Source {
    http: reqwest::Client,
    endpoint: Url,
    client: Client,
}

/// Who asks for tokens and how: what the builder collects and the source sends as is.
struct Client {
    id: String,
    secret: Option<String>,
    auth: ClientAuth,
    grant: Grant,
    scope: Option<String>,
    params: Vec<(String, String)>,
}

enum Grant {
    ClientCredentials,
    // The refresh token in use; replaced when the server rotates it.
    RefreshToken(Mutex<String>),
}

/// How the client authenticates to the token endpoint (RFC 6749 §2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClientAuth {
    /// HTTP Basic with the form-encoded id and secret (`client_secret_basic`); the
    /// method every server must support. The default.
    #[default]
    BasicHeader,
    /// `client_id` and `client_secret` in the form body (`client_secret_post`).
    RequestBody,
}

/// Settings of an [`OAuth2Source`].
pub struct OAuth2SourceBuilder {
    http: Option<reqwest::Client>,
    endpoint: String,
    client: Client,
    allow_http_on_loopback: bool,
}

impl OAuth2Source {
    /// The client-credentials grant (RFC 6749 §4.4) against `token_url`.
    pub fn client_credentials(
        token_url: impl Into<String>,
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
    ) -> OAuth2SourceBuilder {
        OAuth2SourceBuilder::new(
            token_url.into(),
            client_id.into(),
            Some(client_secret.into()),
            Grant::ClientCredentials,
        )
    }

    /// The refresh-token grant (RFC 6749 §6) against `token_url`, for a public client
    /// (add [`OAuth2SourceBuilder::client_secret`] for a confidential one).
    pub fn refresh_token(
        token_url: impl Into<String>,
        client_id: impl Into<String>,
        refresh_token: impl Into<String>,
    ) -> OAuth2SourceBuilder {
        OAuth2SourceBuilder::new(
            token_url.into(),
            client_id.into(),
            None,
            Grant::RefreshToken(Mutex::new(refresh_token.into())),
        )
    }
}

impl Client {
    fn form(&self) -> String {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        match &self.grant {
            Grant::ClientCredentials => {
                form.append_pair("grant_type", "client_credentials");
            }
            Grant::RefreshToken(current) => {
                let current = current.lock().unwrap_or_else(|e| e.into_inner());
                form.append_pair("grant_type", "refresh_token");
                form.append_pair("refresh_token", &current);
            }
        }
        if let Some(scope) = &self.scope {
            form.append_pair("scope", scope);
        }
        for (name, value) in &self.params {
            form.append_pair(name, value);
        }
        match (self.auth, &self.secret) {
            (ClientAuth::RequestBody, Some(secret)) => {
                form.append_pair("client_id", &self.id);
                form.append_pair("client_secret", secret);
            }
            // A public client identifies itself in the body (§3.2.1).
            (_, None) => {
                form.append_pair("client_id", &self.id);
            }
            (ClientAuth::BasicHeader, Some(_)) => {}
        }
        form.finish()
    }

    /// The fields both `Debug` impls show (never the secret or the refresh token).
    fn debug_fields<'a, 'b, 'c>(
        &self,
        d: &'c mut fmt::DebugStruct<'a, 'b>,
    ) -> &'c mut fmt::DebugStruct<'a, 'b> {
        d.field("client_id", &self.id)
            .field("grant", &self.grant)
            .field("client_auth", &self.auth)
            .field("scope", &self.scope)
    }
}

impl OAuth2Source {
    async fn request(&self) -> Result<(StatusCode, Vec<u8>), OAuth2Error> {
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(self.client.form());
        if let (ClientAuth::BasicHeader, Some(secret)) = (self.client.auth, &self.client.secret) {
            // RFC 6749 §2.3.1: both are form-encoded before they go into Basic.
            let id: String =
                url::form_urlencoded::byte_serialize(self.client.id.as_bytes()).collect();
            let secret: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
            request = request.basic_auth(id, Some(secret));
        }
        let mut response = request.send().await.map_err(OAuth2Error::Http)?;
        if response.url() != &self.endpoint {
            // A client that follows redirects already sent the form on; at least no token
            // from elsewhere is taken.
            return Err(OAuth2Error::InvalidResponse(
                "the token endpoint redirected the request".into(),
            ));
        }
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(OAuth2Error::Http)? {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(OAuth2Error::InvalidResponse(format!(
                    "the token response is larger than {MAX_RESPONSE_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    }

    fn parse(&self, status: StatusCode, body: &[u8]) -> Result<AccessToken, OAuth2Error> {
        let json: Option<serde_json::Map<String, Value>> = serde_json::from_slice(body).ok();
        if !status.is_success() {
            let Some(json) = json else {
                return Err(OAuth2Error::UnexpectedStatus { status });
            };
            let Some(code) = json.get("error").and_then(Value::as_str) else {
                return Err(OAuth2Error::UnexpectedStatus { status });
            };
            let text = |name: &str| json.get(name).and_then(Value::as_str).map(str::to_owned);
            return Err(OAuth2Error::Server {
                status,
                code: OAuth2ErrorCode::from_code(code),
                description: text("error_description"),
                uri: text("error_uri"),
            });
        }
        // serde_json's messages can quote the offending value, which may be a secret, so
        // only a fixed description reaches the error.
        let json = json.ok_or_else(|| {
            OAuth2Error::InvalidResponse("the token response is not a JSON object".into())
        })?;
        let secret = json
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                OAuth2Error::InvalidResponse("no access_token string in the token response".into())
            })?;
        match json.get("token_type") {
            // RFC 6749 §5.1 makes it required, but some servers omit it: a bearer token
            // is what was asked for.
            None => {}
            Some(Value::String(t)) if t.eq_ignore_ascii_case("bearer") => {}
            Some(Value::String(t)) => return Err(OAuth2Error::UnsupportedTokenType(t.clone())),
            Some(_) => {
                return Err(OAuth2Error::InvalidResponse(
                    "token_type is not a string".into(),
                ));
            }
        }
        let expires_in = match json.get("expires_in") {
            None | Some(Value::Null) => None,
            Some(value) => Some(parse_expires_in(value).ok_or_else(|| {
                OAuth2Error::InvalidResponse(
                    "expires_in is not a non-negative number of seconds".into(),
                )
            })?),
        };
        if let (Grant::RefreshToken(current), Some(Value::String(rotated))) =
            (&self.client.grant, json.get("refresh_token"))
            && !rotated.is_empty()
        {
            *current.lock().unwrap_or_else(|e| e.into_inner()) = rotated.clone();
        }
        let token = AccessToken::new(secret);
        Ok(match expires_in {
            Some(lifetime) => token.expires_in(lifetime),
            None => token,
        })
    }
}

/// Seconds as a JSON number or, as some servers send it, a numeric string.
fn parse_expires_in(value: &Value) -> Option<Duration> {
    let seconds = match value {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    // Anything beyond a century is "does not expire" in practice; keep it representable.
    Some(Duration::from_secs_f64(
        seconds.min(100.0 * 365.0 * 86_400.0),
    ))
}

#[async_trait::async_trait]
impl TokenSource for OAuth2Source {
    type Error = OAuth2Error;

    async fn fetch(&self) -> Result<AccessToken, OAuth2Error> {
        let (status, body) = self.request().await?;
        self.parse(status, &body)
    }
}

impl OAuth2SourceBuilder {
    fn new(
        endpoint: String,
        client_id: String,
        client_secret: Option<String>,
        grant: Grant,
    ) -> Self {
        OAuth2SourceBuilder {
            http: None,
            endpoint,
            client: Client {
                id: client_id,
                secret: client_secret,
                auth: ClientAuth::default(),
                grant,
                scope: None,
                params: Vec::new(),
            },
            allow_http_on_loopback: false,
        }
    }

    /// The space-separated scopes to ask for (RFC 6749 §3.3).
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.client.scope = Some(scope.into());
        self
    }

    /// The client secret (a confidential client using the refresh-token grant).
    pub fn client_secret(mut self, secret: impl Into<String>) -> Self {
        self.client.secret = Some(secret.into());
        self
    }

    /// How the client authenticates; default [`ClientAuth::BasicHeader`].
    pub fn client_auth(mut self, method: ClientAuth) -> Self {
        self.client.auth = method;
        self
    }

    /// An extra form parameter (e.g. `audience` or `resource`, RFC 8707).
    pub fn param(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.client.params.push((name.into(), value.into()));
        self
    }

    /// The HTTP client for the token endpoint (with the TLS backend you chose). Default: a
    /// client that follows no redirects. Give yours
    /// `.redirect(reqwest::redirect::Policy::none())` too: a `307`/`308` from the endpoint
    /// would resend the body, with the client secret or the refresh token, to the
    /// redirect's target. A response that arrives from another URL than the endpoint is
    /// refused.
    pub fn http_client(mut self, client: reqwest::Client) -> Self {
        self.http = Some(client);
        self
    }

    /// Allows a plain `http` token endpoint on a loopback host (tests, local sidecars).
    pub fn allow_http_on_loopback(mut self) -> Self {
        self.allow_http_on_loopback = true;
        self
    }

    /// The source.
    ///
    /// # Errors
    ///
    /// [`ResilienceError::InvalidConfig`] when the token URL does not parse or is not
    /// `https` (or loopback `http`, when allowed).
    pub fn build(self) -> Result<OAuth2Source, ResilienceError> {
        let endpoint = Url::parse(&self.endpoint).map_err(|e| {
            ResilienceError::InvalidConfig(format!("OAuth2 token URL does not parse: {e}"))
        })?;
        let origin = Origin::from_url(&endpoint).map_err(|e| {
            ResilienceError::InvalidConfig(format!("OAuth2 token URL has no origin: {e}"))
        })?;
        let allowed = match origin.scheme() {
            "https" => true,
            "http" => self.allow_http_on_loopback && super::middleware::is_loopback(&origin),
            _ => false,
        };
        if !allowed {
            return Err(ResilienceError::InvalidConfig(format!(
                "OAuth2 token endpoint {origin} must be https (or http on loopback, when allowed)"
            )));
        }
        let http = match self.http {
            Some(client) => client,
            // A redirect of the token request (307/308 keep method and body) would carry the
            // client secret or the refresh token in the body to wherever it points.
            None => reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| {
                    ResilienceError::InvalidConfig(format!(
                        "OAuth2: the default HTTP client could not be built: {e}"
                    ))
                })?,
        };
        Ok(OAuth2Source {
            http,
            endpoint,
            client: self.client,
        })
    }
}

impl fmt::Debug for OAuth2Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("OAuth2Source");
        d.field("endpoint", &self.endpoint.as_str());
        self.client.debug_fields(&mut d).finish_non_exhaustive()
    }
}

impl fmt::Debug for OAuth2SourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("OAuth2SourceBuilder");
        d.field("endpoint", &self.endpoint);
        self.client.debug_fields(&mut d).finish_non_exhaustive()
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Grant::ClientCredentials => f.write_str("client_credentials"),
            Grant::RefreshToken(_) => f.write_str("refresh_token(<redacted>)"),
        }
    }
}

/// Why an [`OAuth2Source`] fetch failed. Never contains a secret.
#[derive(Debug)]
#[non_exhaustive]
pub enum OAuth2Error {
    /// The token endpoint could not be reached or the response could not be read.
    Http(reqwest::Error),
    /// The server answered with an OAuth 2.0 error response (RFC 6749 §5.2).
    Server {
        /// The HTTP status (400 or 401 per the RFC).
        status: StatusCode,
        /// The `error` code.
        code: OAuth2ErrorCode,
        /// The `error_description`, if any.
        description: Option<String>,
        /// The `error_uri`, if any.
        uri: Option<String>,
    },
    /// A non-success status without an OAuth 2.0 error body.
    UnexpectedStatus {
        /// The HTTP status.
        status: StatusCode,
    },
    /// A success status with a body that is not a usable token response.
    InvalidResponse(String),
    /// The server issued a token of another type than `Bearer` (e.g. `DPoP`, `mac`).
    UnsupportedTokenType(String),
}

/// The `error` code of an OAuth 2.0 error response (RFC 6749 §5.2).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OAuth2ErrorCode {
    /// `invalid_request`
    InvalidRequest,
    /// `invalid_client`: the client id or secret was rejected.
    InvalidClient,
    /// `invalid_grant`: e.g. the refresh token expired or was revoked.
    InvalidGrant,
    /// `unauthorized_client`
    UnauthorizedClient,
    /// `unsupported_grant_type`
    UnsupportedGrantType,
    /// `invalid_scope`
    InvalidScope,
    /// Any other code (extensions, e.g. `temporarily_unavailable`).
    Other(String),
}

impl OAuth2ErrorCode {
    fn from_code(code: &str) -> OAuth2ErrorCode {
        match code {
            "invalid_request" => OAuth2ErrorCode::InvalidRequest,
            "invalid_client" => OAuth2ErrorCode::InvalidClient,
            "invalid_grant" => OAuth2ErrorCode::InvalidGrant,
            "unauthorized_client" => OAuth2ErrorCode::UnauthorizedClient,
            "unsupported_grant_type" => OAuth2ErrorCode::UnsupportedGrantType,
            "invalid_scope" => OAuth2ErrorCode::InvalidScope,
            other => OAuth2ErrorCode::Other(other.to_owned()),
        }
    }

    /// The code as the server wrote it.
    pub fn as_str(&self) -> &str {
        match self {
            OAuth2ErrorCode::InvalidRequest => "invalid_request",
            OAuth2ErrorCode::InvalidClient => "invalid_client",
            OAuth2ErrorCode::InvalidGrant => "invalid_grant",
            OAuth2ErrorCode::UnauthorizedClient => "unauthorized_client",
            OAuth2ErrorCode::UnsupportedGrantType => "unsupported_grant_type",
            OAuth2ErrorCode::InvalidScope => "invalid_scope",
            OAuth2ErrorCode::Other(code) => code,
        }
    }
}

impl fmt::Display for OAuth2Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OAuth2Error::Http(_) => {
                f.write_str("the OAuth 2.0 token endpoint could not be reached")
            }
            OAuth2Error::Server {
                status,
                code,
                description,
                ..
            } => {
                write!(
                    f,
                    "the token endpoint refused ({status}): {}",
                    code.as_str()
                )?;
                if let Some(description) = description {
                    write!(f, " ({description})")?;
                }
                Ok(())
            }
            OAuth2Error::UnexpectedStatus { status } => {
                write!(
                    f,
                    "the token endpoint answered {status} without an OAuth 2.0 error"
                )
            }
            OAuth2Error::InvalidResponse(why) => write!(f, "invalid token response: {why}"),
            OAuth2Error::UnsupportedTokenType(t) => {
                write!(
                    f,
                    "the token endpoint issued a {t:?} token, not a bearer token"
                )
            }
        }
    }
}

impl std::error::Error for OAuth2Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OAuth2Error::Http(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn expires_in_accepts_numbers_and_numeric_strings_only() {
        assert_eq!(
            parse_expires_in(&json!(3600)),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            parse_expires_in(&json!("60")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_expires_in(&json!(1.5)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_expires_in(&json!(-1)), None);
        assert_eq!(parse_expires_in(&json!("soon")), None);
        assert_eq!(parse_expires_in(&json!(true)), None);
        assert!(parse_expires_in(&json!(1e300)).is_some());
    }

    #[test]
    fn error_codes_round_trip() {
        for code in [
            "invalid_request",
            "invalid_client",
            "invalid_grant",
            "unauthorized_client",
            "unsupported_grant_type",
            "invalid_scope",
            "temporarily_unavailable",
        ] {
            assert_eq!(OAuth2ErrorCode::from_code(code).as_str(), code);
        }
    }
}

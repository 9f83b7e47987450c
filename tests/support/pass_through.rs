//! `Passthrough`: a middleware that only calls the next one, what any one layer of
//! reqwest-middleware costs (its `async_trait` box and `Next::run`). Included through
//! `#[path]` by the transport and instructions benches; not declared in `support/mod.rs`.

/// Does nothing but call the next middleware.
pub struct Passthrough;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Passthrough {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        next.run(req, extensions).await
    }
}

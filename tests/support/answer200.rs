//! `Answer200`: an innermost middleware that answers `200` with no body at once, so a
//! stack can be timed or counted without I/O. Included through `#[path]` by
//! `tests/alloc_budget.rs` and the stack, retry and breaker benches; not declared in
//! `support/mod.rs`, which the other tests compile and which has no use for it.

/// Stands in for the network: a `200` with no body.
pub struct Answer200;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Answer200 {
    async fn handle(
        &self,
        _: reqwest::Request,
        _: &mut http::Extensions,
        _: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        Ok(reqwest::Response::from(
            http::Response::builder()
                .status(200)
                .body("")
                .expect("a response"),
        ))
    }
}

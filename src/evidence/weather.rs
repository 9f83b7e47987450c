//! The transport step's part in network weather (`crate::network`): an attempt watched
//! for progress and for a change of the network, sent on a client none of whose
//! connections predate the last change, and its cut recorded.

use std::future::Future;

use http::Extensions;
use reqwest::{Request, Response};

use crate::error::ResilienceError;
use crate::network::progress::{Cut, Watch};
use crate::network::weather::Weather;
use crate::origin::Origin;
use crate::record::{FailureKind, RequestEvidence, Transmission};
use crate::stage::{Either, HandedRequest, Handled, Handover, RestOfStack};

/// What one attempt is watched for, and the client it goes out on.
pub(super) struct Prepared {
    pub(super) watch: Watch,
    pub(super) client: Option<reqwest::Client>,
}

/// Prepares an attempt of `req` (its body made to report its progress): a network
/// change cuts only an attempt harmless to repeat; a rebuilt client is used unless a
/// proxy pool (`routed`) chooses the client.
pub(super) fn prepare(weather: &Weather, req: &mut Request, routed: bool) -> Prepared {
    let generation = weather.look();
    let idempotent = crate::record::idempotent_request(req.method(), req.headers());
    let no_progress = weather.network.no_progress.map(|bound| {
        let upload = crate::network::progress::report_upload(req);
        (bound, tokio::time::Instant::now(), upload)
    });
    Prepared {
        watch: Watch {
            no_progress,
            changes: idempotent.then(|| (weather.changes(), generation)),
        },
        client: if routed {
            None
        } else {
            weather.client(generation)
        },
    }
}

/// The attempt's result, and the evidence of the cut when one cut it.
pub(super) fn outcome(
    outcome: Result<reqwest_middleware::Result<Response>, Cut>,
    origin: &Option<Origin>,
    attempt: u32,
) -> (
    reqwest_middleware::Result<Response>,
    Option<RequestEvidence>,
) {
    match outcome {
        Ok(result) => (result, None),
        Err(c) => {
            let (evidence, error) = cut(c, origin.clone(), attempt);
            (Err(error), Some(evidence))
        }
    }
}

/// The evidence and the error of an attempt `guarded` cut.
fn cut(
    cut: Cut,
    origin: Option<Origin>,
    attempt: u32,
) -> (RequestEvidence, reqwest_middleware::Error) {
    let (kind, error) = match (cut, origin.clone()) {
        (Cut::NoProgress(after), Some(origin)) => (
            FailureKind::NoProgress,
            Some(ResilienceError::NoProgress { origin, after }),
        ),
        (Cut::NetworkChanged, Some(origin)) => (
            FailureKind::NetworkChanged,
            Some(ResilienceError::NetworkChanged { origin }),
        ),
        (Cut::NoProgress(_), None) => (FailureKind::NoProgress, None),
        (Cut::NetworkChanged, None) => (FailureKind::NetworkChanged, None),
    };
    let mut evidence = RequestEvidence::new(Transmission::Unknown, origin, attempt);
    evidence.failure = Some(kind);
    let error = match error {
        Some(e) => reqwest_middleware::Error::middleware(e),
        None => reqwest_middleware::Error::middleware(ResilienceError::InvalidConfig(
            "a request without an origin was cut".into(),
        )),
    };
    (evidence, error)
}

/// The response of a watched attempt: its body bounded too, unless it is small enough to
/// come with its head ([`crate::network::progress::comes_with_head`]).
pub(super) fn bound_response(response: Response, weather: Option<&Weather>) -> Response {
    match weather.and_then(|w| w.network.no_progress) {
        Some(_) if crate::network::progress::comes_with_head(&response) => response,
        Some(bound) => crate::network::progress::bound_body(response, bound),
        None => response,
    }
}

/// The rest of the stack, or a fresh client in its place after a network change.
#[derive(Clone)]
pub(super) struct OnClient<N> {
    pub(super) client: Option<reqwest::Client>,
    pub(super) next: N,
}

impl<N: RestOfStack> RestOfStack for OnClient<N> {
    const MAKING_DOES_WORK: bool = N::MAKING_DOES_WORK;

    fn routed(&self) -> bool {
        self.next.routed()
    }

    fn run<'a>(
        self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a
    where
        Self: 'a,
    {
        match self.client {
            None => Either::Stage {
                future: self.next.run(req, extensions, handover),
            },
            Some(client) => Either::Skip {
                future: on_client(client, req.take()),
            },
        }
    }
}

fn on_client(client: reqwest::Client, req: Request) -> Handled<'static> {
    Box::pin(async move {
        client
            .execute(req)
            .await
            .map_err(reqwest_middleware::Error::Reqwest)
    })
}
